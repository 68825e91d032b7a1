"""The benchmark suite's results as tables: every shape and dtype, pysoftmax's algorithms beside
the fastest peer, in GB/s and % of the copy bandwidth, and the shapes where a goal is missed.

Reads a pytest-benchmark JSON document written by the suite (a baseline in
``benchmarks/baselines/``, or ``pytest benchmarks --benchmark-json=F``): its ``extra_info`` holds
each benchmark's GB/s, % of copy and the copy bandwidth of that run. Needs neither a GPU nor CuPy.

    python3 -m pysoftmax report benchmarks/baselines/nvidia-h200.json

The goals are those of issues 22 and 23 ("Done when"): on shapes whose input is 64 MiB or more,
``fused`` forward, masked forward and ``backward`` at 92% of copy or more up to 32768 columns
(``fused`` and ``backward`` at 90% or more past that); ``online`` at 90% and ``naive`` and ``naive_backward`` at 80% from 32 to
32768 columns; and on every shape ``fused``, the masked forward and ``backward`` at least as fast
as the fastest peer of the same problem.
"""

import json
import re

# pysoftmax's algorithm in each column, and the peers it is held against (the suite's names).
FORWARD_PEERS = ("torch", "torch_compile", "cupy")
MASKED_PEERS = ("torch_compile_masked",)
BACKWARD_PEERS = ("torch", "torch_compile")
SHORT_MAX_COLS = 32768       # issue 23's rows; longer ones are issue 22's
GOAL_MIN_BYTES = 64 << 20    # the input's size from which the bandwidth goals apply
REFERENCE_MIN_COLS = 32      # the reference algorithms' goals start at rows of this many columns
REFERENCES = ("online", "naive", "naive_backward")
GOALS = (  # (column, % of copy up to SHORT_MAX_COLS, % past it; None: no goal there)
    ("fused", 92, 90),
    ("fused_masked", 92, None),
    ("backward", 92, 90),
    ("online", 90, None),
    ("naive", 80, None),
    ("naive_backward", 80, None),
)
RACES = (("fused", FORWARD_PEERS), ("fused_masked", MASKED_PEERS), ("backward", BACKWARD_PEERS))
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
_NAME = re.compile(r"\[(fwd|bwd)-(\d+)x(\d+)-(\w+)-(\w+)\]$")


def load(path):
    """(meta, cases): cases maps (rows, cols, dtype) to {column: {"gbs", "pct"}}, the backward's
    algorithms under their own names ("backward", "naive_backward") and its peers as
    "bwd:torch", "bwd:torch_compile"; meta has the run's commit, date and copy GB/s."""
    with open(path) as f:
        doc = json.load(f)
    cases, copies = {}, []
    for b in doc.get("benchmarks", []):
        m = _NAME.search(b.get("name", ""))
        info = b.get("extra_info") or {}
        if not m or "gbs" not in info:
            continue
        direction, rows, cols, dtype, algo = m.groups()
        column = f"bwd:{algo}" if direction == "bwd" and algo in BACKWARD_PEERS else algo
        copy = info.get("copy_gbs")
        pct = info["pct_copy"] if "pct_copy" in info else 100 * info["gbs"] / copy if copy else float("nan")
        cases.setdefault((int(rows), int(cols), dtype), {})[column] = dict(gbs=info["gbs"], pct=pct)
        copies.append(copy)
    commit = doc.get("commit_info") or {}
    copies = sorted(c for c in copies if c)
    meta = dict(commit=(commit.get("id") or "")[:7], dirty=bool(commit.get("dirty")), date=doc.get("datetime", ""),
                copy=(copies[0], copies[-1]) if copies else None)
    return meta, cases


def _peer_columns(column, peers):
    return [f"bwd:{p}" for p in peers] if column == "backward" else list(peers)


def fastest_peer(results, column, peers):
    """(name, GB/s) of the fastest peer measured for this column, or None."""
    got = [(results[c]["gbs"], c.split(":")[-1]) for c in _peer_columns(column, peers) if c in results]
    if not got:
        return None
    gbs, name = max(got)
    return name, gbs


def misses(cases):
    """The goals' misses, in the order of GOALS then RACES: (goal text, [(shape, dtype, detail)])
    for every goal, with an empty list where every shape meets it."""
    out = []
    for column, short_pct, long_pct in GOALS:
        for limit, span in ((short_pct, f"<= {SHORT_MAX_COLS} columns"), (long_pct, f"> {SHORT_MAX_COLS} columns")):
            if limit is None:
                continue
            bad, total = [], 0
            for (rows, cols, dtype), results in sorted(cases.items(), key=_order):
                long_row = cols > SHORT_MAX_COLS
                if long_row != (span[0] == ">") or column not in results:
                    continue
                if column in REFERENCES and cols < REFERENCE_MIN_COLS:
                    continue
                if rows * cols * _ITEMSIZE.get(dtype, 4) < GOAL_MIN_BYTES:
                    continue
                total += 1
                pct = results[column]["pct"]
                if not pct >= limit:  # NaN (no copy bandwidth recorded) misses too
                    bad.append((f"{rows}x{cols}", dtype, f"{pct:.2f}%"))
            out.append((f"{column} >= {limit}% of copy ({span}, >= {GOAL_MIN_BYTES >> 20} MiB): "
                        f"{total - len(bad)} of {total}", bad))
    for column, peers in RACES:
        bad, total = [], 0
        for (rows, cols, dtype), results in sorted(cases.items(), key=_order):
            peer = fastest_peer(results, column, peers)
            if column not in results or peer is None:
                continue
            total += 1
            ratio = results[column]["gbs"] / peer[1]
            if ratio < 1.0:
                bad.append((f"{rows}x{cols}", dtype, f"{ratio:.3f}x {peer[0]} ({results[column]['gbs']:.0f} against {peer[1]:.0f} GB/s)"))
        out.append((f"{column} >= 1.00x the fastest of {', '.join(peers)}: {total - len(bad)} of {total}", bad))
    return out


def _order(item):
    (rows, cols, dtype), _ = item
    return ({"float32": 0, "float16": 1, "bfloat16": 2}.get(dtype, 3), cols > SHORT_MAX_COLS, cols, rows)


def _cell(results, column):
    r = results.get(column)
    return f"{r['gbs']:.0f} ({r['pct']:.0f}%)" if r else "-"


def _peer_cell(results, column, peers):
    mine, peer = results.get(column), fastest_peer(results, column, peers)
    if peer is None:
        return "-"
    name, gbs = peer
    ratio = f", {mine['gbs'] / gbs:.2f}x" if mine else ""
    return f"{gbs:.0f} {name}{ratio}"


def markdown(meta, cases):
    """The tables (one per dtype) and the goals' misses, as Markdown."""
    lines = []
    copy = meta["copy"]
    span = (f"{copy[0]:.0f}" if copy[0] == copy[1] else f"{copy[0]:.0f}-{copy[1]:.0f}") if copy else "?"
    lines.append(f"Run of {meta['date'][:10] or '?'}, commit {meta['commit'] or '?'}{' (with local changes)' if meta['dirty'] else ''}; "
                 f"copy {span} GB/s. GB/s (% of copy); the peer cells give the fastest peer's GB/s, "
                 f"its name, and pysoftmax's speed over it.")
    by_dtype = {}
    for key, results in sorted(cases.items(), key=_order):
        by_dtype.setdefault(key[2], []).append((key, results))
    for dtype, items in by_dtype.items():
        lines += ["", f"**{dtype}**", "",
                  "| rows x cols | fused | fastest peer | fused + mask + causal | compiled composed | backward "
                  "| fastest peer | online | naive | naive_backward |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for (rows, cols, _), r in items:
            lines.append(f"| {rows}x{cols} | {_cell(r, 'fused')} | {_peer_cell(r, 'fused', FORWARD_PEERS)} "
                         f"| {_cell(r, 'fused_masked')} | {_peer_cell(r, 'fused_masked', MASKED_PEERS)} "
                         f"| {_cell(r, 'backward')} | {_peer_cell(r, 'backward', BACKWARD_PEERS)} "
                         f"| {_cell(r, 'online')} | {_cell(r, 'naive')} | {_cell(r, 'naive_backward')} |")
    lines += ["", "Goals (issues 22 and 23):", ""]
    for goal, bad in misses(cases):
        lines.append(f"- {goal}" + ("" if not bad else "; missed on " + ", ".join(f"{s} {d} {x}" for s, d, x in bad)))
    return "\n".join(lines)
