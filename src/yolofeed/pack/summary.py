"""What one split's build (or reuse) did, and the few lines ``yolofeed pack`` prints about it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from yolofeed.pack.layout import printable
from yolofeed.pack.report import where_listed
from yolofeed.pack.space import gb
from yolofeed.pack.store import Pack


@dataclass
class BuildResult:
    """What one split's build did, for the summary and the report file."""

    pack: Pack
    built: bool  # False: an up-to-date pack was reused
    seconds: float = 0.0
    verified: bool = False  # every payload's checksum was read back (verify=True on a reused pack)


def summary(result: BuildResult, max_listed: int = 10) -> str:
    """A few lines for the terminal: images, boxes, skipped with reasons, bytes, build rate."""
    p, h = result.pack, result.pack.header
    c = h["counts"]
    size = p.path.stat().st_size
    lines = [f"pack {p.split}: {c['images']:,} images, {c['boxes']:,} boxes, {c['skipped']} skipped, "
             f"{gb(size)} ({p.format}, imgsz {p.imgsz})"]
    if result.built:
        rate = c["tried"] / max(result.seconds, 1e-9)
        synced = ", synced to disk" if h["build"].get("sync") else ""
        lines[0] += f", built in {result.seconds:.1f} s ({rate:,.0f} img/s, {h['build']['workers']} workers{synced})"
    else:
        lines[0] += f", up to date (built {h['created']})"
        if result.verified:
            lines[0] += f"; verified: the stored pixels of all {c['images']:,} images match their checksums"
    for f, r in h["skipped"][:max_listed]:
        lines.append(f"  skipped {printable(f)}: {printable(r)}")
    if len(h["skipped"]) > max_listed:
        lines.append(f"  ... {len(h['skipped']) - max_listed} more skipped")
    for note, count in Counter(n.split(":")[0] for _, n in h["notes"]).most_common(5):
        lines.append(f"  note: {count}x {note}")
    if h["skipped"] or h["notes"]:
        lines.append(f"  {where_listed(p.path, len(h['skipped']), len(h['notes']))}")
    lines.append(f"  -> {p.path}")
    return "\n".join(lines)
