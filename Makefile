# Two commands do all set-up on a fresh machine:
#   make demo  - create .venv, install, generate a synthetic dataset and run the main job on it
#   make test  - create .venv if needed, install, lint (ruff, rules in pyproject.toml), run the tests (CPU only,
#                two processes, each test file in one of them) but those marked slow: a few minutes on 2 cores
#   make test-slow - the tests marked slow (end-to-end trainings, benches, kills, resumes, the statistical and
#                interpreter-mode kernel tests): CI runs them after make test; make test-all runs both tiers
#   make test-releases - the seam's tests and a CPU training under the oldest, a middle and the newest Ultralytics
#                of the range yolofeed supports (ultralytics_seam.SUPPORTED), each installed into its own folder
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DEMO   := demo

# Nothing may download at run time: Ultralytics skips its network checks with this.
export YOLO_OFFLINE := 1

# The oldest, a middle and the newest release of ultralytics_seam.SUPPORTED (tests/test_seam.py checks the ends), and
# where each is installed apart from the venv's (pip --target, no dependencies: the venv's serve every 8.4 release).
RELEASES     := 8.4.138 8.4.164 8.4.190
RELEASES_DIR := .releases
# Per release: the seam (versions, attributes, recorded sources, label rules), the tests that hold yolofeed's copies and
# ops to that release's own (the loss, the augmentation, the pack's label rules, the keys table), which optimiser
# yolofeed's trainers step with, and one real training, the quickest: yolofeed's trainer for 2 epochs and stock for 1,
# their results.csv compared; the final validation's figures and image grids drawn as that release draws them, and
# best.pt's FLOPs count as its load makes it. About a minute a release on 2 cores. The middle release is 8.4.164: the
# only one of its label rules, and older than the assigner's pair_overlaps.
RELEASE_TESTS := tests/test_seam.py tests/test_loss.py tests/test_augment_ops.py tests/test_copy_paste.py \
                 tests/test_augment_obb.py::test_copy_paste_gives_ultralytics_oriented_boxes_and_pixels \
                 tests/pack/test_verify.py \
                 tests/test_keys.py \
                 tests/test_musgd.py::test_the_trainer_steps_the_musgd_ultralytics_builds_as_fast_musgd \
                 tests/test_train.py::test_trains_and_writes_ultralytics_results \
                 tests/test_plots.py::test_the_final_validations_figures_drawn_by_children_are_stocks_byte_for_byte \
                 tests/test_plots.py::test_the_final_validations_image_grids_get_the_images_they_show_and_are_stocks \
                 tests/test_validation_thread.py::test_best_pts_flops_count_ahead_is_the_one_its_load_makes

.PHONY: demo test test-slow test-all test-releases clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

test: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m pytest -n 2 --dist loadfile -m "not slow"

test-slow: $(VENV)/.installed
	$(PY) -m pytest -n 2 --dist loadfile -m slow

test-all: test test-slow

# Each release first on the path; YOLOFEED_EXPECT_ULTRALYTICS makes the seam's tests fail if another one is imported.
test-releases: $(VENV)/.installed
	@set -e; for v in $(RELEASES); do \
	  dir=$(abspath $(RELEASES_DIR))/$$v; \
	  [ -f $$dir/ultralytics/__init__.py ] || $(PY) -m pip install --quiet --no-deps --target $$dir ultralytics==$$v; \
	  PYTHONPATH=$$dir$${PYTHONPATH:+:$$PYTHONPATH} $(PY) -c 'import ultralytics; print("== Ultralytics", ultralytics.__version__, "from", ultralytics.__file__)'; \
	  PYTHONPATH=$$dir$${PYTHONPATH:+:$$PYTHONPATH} YOLOFEED_EXPECT_ULTRALYTICS=$$v $(PY) -m pytest -q $(RELEASE_TESTS); \
	done

demo: $(VENV)/.installed
	$(PY) -m yolofeed synth out=$(DEMO)/data n_train=256 n_val=64 seed=0
	$(PY) -m yolofeed pack data=$(DEMO)/data/data.yaml imgsz=320
	$(PY) -m yolofeed train model=yolo11n.yaml data=$(DEMO)/data/data.yaml imgsz=320 epochs=1 batch=16 \
		project=$(abspath $(DEMO))/runs name=train exist_ok=True plots=False verbose=False

clean:
	rm -rf $(DEMO) .pytest_cache $(RELEASES_DIR)
