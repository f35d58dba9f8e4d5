# Two commands do all set-up on a fresh machine:
#   make demo  - create .venv, install, generate a synthetic dataset and run the main job on it
#   make test  - create .venv if needed, install, lint (ruff, rules in pyproject.toml), run the tests (CPU only,
#                two processes, each test file in one of them)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DEMO   := demo

# Nothing may download at run time: Ultralytics skips its network checks with this.
export YOLO_OFFLINE := 1

.PHONY: demo test clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

test: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m pytest -n 2 --dist loadfile

demo: $(VENV)/.installed
	$(PY) -m yolofeed synth out=$(DEMO)/data n_train=256 n_val=64 seed=0
	$(PY) -m yolofeed pack data=$(DEMO)/data/data.yaml imgsz=320
	$(PY) -m yolofeed train model=yolo11n.yaml data=$(DEMO)/data/data.yaml imgsz=320 epochs=1 batch=16 \
		project=$(abspath $(DEMO))/runs name=train exist_ok=True plots=False verbose=False

clean:
	rm -rf $(DEMO) .pytest_cache
