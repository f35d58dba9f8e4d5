"""The report beside a pack (pack/report.py): one entry a line whatever the file's name, never written through a
link or over a file yolofeed did not write. RELIABILITY.md lists these tests with their outcomes.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

from helpers import VICTIM
from helpers import build_out as _build
from helpers import planted_folder as _folder
from yolofeed.cli import main
from yolofeed.pack.paths import store_dir
from yolofeed.pack.report import read_report


def test_the_report_is_never_written_through_a_link_or_over_a_file_yolofeed_did_not_make(dataset, tmp_path, caplog):
    """The report's temporary name was predictable (``.train.report.txt.tmp-<pid>``) and written through a link;
    ``train.report.txt`` itself was overwritten whatever it was. Now: a new name taken with O_EXCL; a report name
    that holds someone else's file or a link is left as it is, with a warning, and the pack is still built."""
    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    folder = _folder(yaml_file, out)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    (folder / f".train.report.txt.tmp-{os.getpid()}").symlink_to(victim)  # the old name of this process's report
    pack = _build(yaml_file, out)
    assert victim.read_bytes() == VICTIM
    assert (folder / "train.report.txt").read_text().startswith("# train.yfpack: 0 skipped, 0 notes.")

    for planted in ("own notes", "link"):
        report = folder / "train.report.txt"
        report.unlink()
        if planted == "own notes":
            report.write_bytes(VICTIM)
        else:
            report.symlink_to(victim)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert _build(yaml_file, out, rebuild="always") and pack.path.exists()
        assert "did not write its report" in caplog.text and f"{report} is" in caplog.text
        assert victim.read_bytes() == VICTIM and (report.is_symlink() == (planted == "link"))
        if planted == "own notes":
            assert report.read_bytes() == VICTIM


def test_a_name_with_a_newline_or_a_tab_stays_one_report_entry(dataset, capsys):
    """Linux allows a newline or a tab in a file name: the report (one entry a line, tab-separated) broke in two
    lines, or grew a column. Such a field is now quoted as ``ls`` quotes such names (``$'...'``), which pastes into
    bash as the very name and ``read_report`` reads back; the summary shows it escaped, on one line."""
    img = dataset / "images" / "train"
    odd = [img / "two\nlines.jpg", img / "a\ttab, it's.jpg", img / "$'looks quoted'.jpg"]
    for path in odd:
        path.write_bytes(b"")  # skipped: empty
    assert main(["pack", f"data={dataset / 'data.yaml'}", "imgsz=64", "workers=1", "splits=train"]) == 0
    out = capsys.readouterr().out
    assert "two\\nlines.jpg: empty file" in out and "a\\ttab, it's.jpg: empty file" in out
    dest = store_dir(dataset / "data.yaml", 64, "raw") / "train.yfpack"
    lines = (dest.parent / "train.report.txt").read_text().split("\n")[1:-1]
    assert len(lines) == 3 and all(len(line.split("\t")) == 3 for line in lines), lines
    assert sorted(row[0] for row in read_report(dest)) == sorted(map(str, odd))
    quoted = [line.split("\t")[0] for line in lines if line.startswith("$'")]
    assert len(quoted) == 2  # the newline and the tab; a quote or a $ alone needs none
    if shutil.which("bash"):  # pasted into a shell, each names its file
        for field in quoted:
            assert subprocess.run(["bash", "-c", f"test -e {field}"]).returncode == 0, field


def test_the_summary_names_the_report_only_where_it_was_written(dataset, tmp_path, caplog, capsys):
    """A pack with a skipped image names its report as the full list; where the report's name holds a link (left as
    it is), the summary says the list is in the pack's header instead of naming the link."""
    (dataset / "images" / "train" / "empty.jpg").write_bytes(b"")  # skipped: empty
    args = ["pack", f"data={dataset / 'data.yaml'}", "imgsz=64", "workers=1", "splits=train"]
    assert main(args) == 0
    report = store_dir(dataset / "data.yaml", 64, "raw") / "train.report.txt"
    assert f"full list: {report}\n" in capsys.readouterr().out
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    report.unlink()
    report.symlink_to(victim)
    with caplog.at_level(logging.WARNING):
        assert main([*args, "rebuild=always"]) == 0
    said = capsys.readouterr().out + caplog.text
    assert f"full list: in the pack's header ({report} is not its report: not written)" in said
    assert f"full list: {report}\n" not in said and victim.read_bytes() == VICTIM


def test_one_mistake_in_many_label_files_is_one_reason_with_its_count():
    """The reasons name their label file and quote its values, so every file was a reason of its own: "1x a.txt uses
    class 3 ...; 1x b.txt uses class 2 ...; and 16 more". Counted by kind, without the paths and the values quoted."""
    from yolofeed.pack.report import commonest_reasons, reason_kind

    skipped = [(f"/d/images/train/{i}.jpg", f"/d/labels/train/{i}.txt uses class {c} but the data yaml has nc=2 "
                f"(classes 0-1); fix the label") for i, c in ((0, 3), (1, 2), (2, 7))]
    skipped += [(f"/d/images/train/{i}.jpg", f"/d/labels/train/{i}.txt has coordinates above 1 ({i}.5, 4{i}.25): "
                 "YOLO labels are normalised") for i in (3, 4)]
    skipped += [(f"/d/images/train/{i}.jpg", "empty file (0 bytes)") for i in (5, 6)]
    skipped += [("/d/images/train/7.jpg", "image is 1x1 px; Ultralytics needs at least 10 px a side")]
    assert reason_kind(*skipped[0]) == reason_kind(*skipped[2]) != reason_kind(*skipped[3])
    top = commonest_reasons(skipped, 3)
    assert [kind.count for kind in top] == [3, 2, 2]
    assert (top[0].image, top[0].reason) == skipped[0]
    assert top[0].said() == f"3x, the first: {skipped[0][1]}"  # its first, said as one of them (it names its file)
    assert top[1].said() == f"2x, the first: {skipped[3][1]}"
    assert top[2].said() == "2x empty file (0 bytes) (first: /d/images/train/5.jpg)"  # one reason, said as it is
    small = ("/d/images/train/8.jpg", "image is 2x1 px; Ultralytics needs at least 10 px a side")
    said = commonest_reasons(skipped[-1:] + [small], 1)[0].said()
    assert said == f"2x, the first: /d/images/train/7.jpg: {skipped[-1][1]}"  # named once where its reason does not
