"""What ``yolofeed pack`` prints about each split it built or found up to date (pack/summary.py)."""

from __future__ import annotations


def test_cli_pack_prints_summary(dataset, capsys):
    from yolofeed.cli import main

    assert main(["pack", f"data={dataset / 'data.yaml'}", "imgsz=128", "workers=2", "sync=True"]) == 0
    out = capsys.readouterr().out
    assert "pack train: 24 images" in out and "pack val: 8 images" in out and "img/s" in out
    assert "synced to disk" in out
    assert main(["pack", f"data={dataset / 'data.yaml'}", "imgsz=128"]) == 0
    assert "up to date" in capsys.readouterr().out
