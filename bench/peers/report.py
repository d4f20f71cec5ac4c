"""Turns one `make bench-peers` run into the "Peers" section of
docs/BENCHMARKS.md: a markdown table (median ms/step and the ratio to the
fastest entry of its row) and a chart (matplotlib, else gnuplot, else none,
with a note). Only the part of the section for this device (cpu or cuda)
is replaced; the rest of the file, other engineers' sections included, is
kept as it is. Standard library only, so the report works without numpy."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

SECTION = "## Peers"
PEERS_INTRO = """## Peers

The same models, batch sizes, optimizers and synthetic data (the same two
batches, bit for bit, alternated) run in mptc and in PyTorch,
TensorFlow/Keras and JAX, side by side in one run of
`make bench-peers` (bench/run_peers.sh; the peer scripts are in bench/peers/),
every process pinned to the same cores with the same thread count.
Each cell is the median milliseconds per training step (forward, loss,
backward, optimizer update) and, in parentheses, its ratio to the fastest
entry of its row; the fastest is in bold. A peer that is not installed is
skipped with a note, never estimated; a cell measured only in rounds that
`mptc devices --quiet-check` found busy is marked †.
"""


def load_rows(path):
    """Peer rows; a line {"round": N} (run_peers.sh) says which round the
    rows after it belong to."""
    rows, rnd = [], None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    print(f"report: ignoring a malformed line in {path}: {line[:80]}", file=sys.stderr)
                    continue
                if "peer" not in obj:
                    rnd = obj.get("round", rnd)
                    continue
                if rnd is not None:
                    obj.setdefault("round", rnd)
                rows.append(obj)
    return rows


def mptc_rows(model, path, rnd=None):
    """mptc bench --json cells as peer rows; the column says which backend ran."""
    with open(path) as f:
        doc = json.load(f)
    out = []
    for c in doc.get("cells", []):
        backend = c.get("backend", "")
        label = {"interp": "reference interpreter", "cpu": "CPU JIT", "cuda": "CUDA"}.get(backend, backend or "?")
        row = dict(peer=f"mptc ({label})", variant=c["variant"], model=model, policy=c["policy"],
                   batch=int(c["batch"]), status=c["status"])
        if rnd is not None:
            row["round"] = rnd
        if c["status"] == "ok":
            row["ms_per_step"] = c["ms_per_step"]
            row["samples_per_s"] = c["samples_per_s"]
        else:
            row["reason"] = c.get("reason", "")
        out.append(row)
    return out


def column(r):
    return f"{r['peer']} {r['variant']}"


def fastest_rounds(rows, busy_rounds=()):
    """One row per cell: with several rounds (run_peers.sh --rounds), the
    fastest successful one from a quiet round, else the fastest from a busy
    round (marked busy), else the first."""
    best, order = {}, []

    def rank(r):  # lower is better
        ok = r.get("status") == "ok"
        return (not ok, r.get("round") in busy_rounds, r["ms_per_step"] if ok else 0)

    for r in rows:
        k = (column(r), r["model"], r["policy"], r["batch"])
        if k not in best:
            best[k] = r
            order.append(k)
        elif rank(r) < rank(best[k]):
            best[k] = r
    out = []
    for k in order:
        r = dict(best[k])
        r["busy"] = r.get("round") in busy_rounds
        out.append(r)
    return out


BUSY_MARK = "†"


def cell(r, best):
    if r is None:
        return "-"
    if r.get("status") != "ok":
        return "OOM" if r.get("status") == "oom" else "failed"
    ms = r["ms_per_step"]
    text = f"{ms:.1f} ({ms / best:.2f}x)" if best else f"{ms:.1f}"
    text = f"**{text}**" if best and ms == best else text
    return text + (f" {BUSY_MARK}" if r.get("busy") else "")


def table(rows):
    cols = []
    for r in rows:
        if column(r) not in cols:
            cols.append(column(r))
    sizes = {}  # (model, policy, batch) -> its input's size as a label, in first-seen order
    for r in rows:
        k = (r["model"], r["policy"], r["batch"])
        size = (f"{r['image_size']}x{r['image_size']}x3" if r.get("image_size") else
                f"context {r['context']}" if r.get("context") else None)
        sizes[k] = sizes.get(k) or size
    keys = [(m, sizes[(m, p, b)], p, b) for m, p, b in sizes]
    lines = ["| model | policy | batch | " + " | ".join(cols) + " |",
             "|---|---|---:|" + "---:|" * len(cols)]
    for model, size, policy, batch in keys:
        by = {column(r): r for r in rows if (r["model"], r["policy"], r["batch"]) == (model, policy, batch)}
        oks = [r["ms_per_step"] for r in by.values() if r.get("status") == "ok"]
        best = min(oks) if oks else None
        name = f"{model} {size}" if size else model
        lines.append(f"| {name} | {policy} | {batch} | " + " | ".join(cell(by.get(c), best) for c in cols) + " |")
    return "\n".join(lines), cols, keys


def setups(rows):
    """What each peer column ran, from the rows' "setup" fields: one note a
    column and setup, with the models it applied to."""
    seen = {}
    for r in rows:
        if r.get("setup"):
            seen.setdefault((column(r), r["setup"]), []).append(r["model"])
    return [f"{c} ({', '.join(dict.fromkeys(models))}): {text}" for (c, text), models in seen.items()]


def failures(rows):
    return [f"- {column(r)}, {r['model']} {r['policy']} batch {r['batch']}: {r.get('status')}: {r.get('reason', '')}"
            for r in rows if r.get("status") != "ok"]


def chart(rows, cols, keys, png, title):
    """Grouped bars, log scale: one group per (model, policy), one bar per column.
    Returns a note when no chart could be drawn, else None."""
    groups = [f"{m}\n{p}" for m, _, p, _ in keys]
    series = {c: [] for c in cols}
    for m, _, p, b in keys:
        by = {column(r): r for r in rows if (r["model"], r["policy"], r["batch"]) == (m, p, b)}
        for c in cols:
            r = by.get(c)
            series[c].append(r["ms_per_step"] if r and r.get("status") == "ok" else None)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
    if plt:
        fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(groups) + 3), 5.4))
        w = 0.8 / max(1, len(cols))
        for i, c in enumerate(cols):
            xs = [g + (i - (len(cols) - 1) / 2) * w for g in range(len(groups))]
            ax.bar([x for x, v in zip(xs, series[c]) if v], [v for v in series[c] if v], w, label=c)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups)
        ax.set_yscale("log")
        ax.set_ylabel("ms per training step (log scale, lower is faster)")
        ax.set_title(title)
        ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))
        ax.grid(axis="y", which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(png, dpi=100)
        plt.close(fig)
        return None
    if shutil.which("gnuplot"):
        data = "\n".join(" ".join([f'"{g.replace(chr(10), " ")}"'] +
                                  [f"{series[c][i]:.6g}" if series[c][i] else "?" for c in cols])
                         for i, g in enumerate(groups))
        script = (f'set terminal png size 1000,560\nset output "{png}"\nset title "{title}" noenhanced\n'
                  'set style data histograms\nset style histogram clustered\nset style fill solid\n'
                  'set logscale y\nset ylabel "ms per training step (log scale)"\nset datafile missing "?"\n'
                  'set key noenhanced\n$d << EOD\n' + data + "\nEOD\nplot " +
                  ", ".join(f'$d using {i + 2}:xtic(1) title "{c}"' for i, c in enumerate(cols)) + "\n")
        p = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
        return None if p.returncode == 0 else f"gnuplot failed: {p.stderr.strip()[:200]}"
    return "no chart: neither matplotlib nor gnuplot is installed"


def replace_part(doc_text, key, body):
    """Puts body between this device's markers inside the Peers section,
    creating the section or the markers where missing."""
    begin, end = f"<!-- peers:{key} begin -->", f"<!-- peers:{key} end -->"
    part = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in doc_text and end in doc_text:
        a, b = doc_text.index(begin), doc_text.index(end) + len(end)
        return doc_text[:a] + part + doc_text[b:]
    m = re.search(r"^## Peers[ \t]*$", doc_text, re.M)
    if not m:
        head = doc_text.rstrip("\n") + "\n\n" if doc_text.strip() else ""
        return head + PEERS_INTRO + "\n" + part + "\n"
    nxt = re.search(r"^## ", doc_text[m.end():], re.M)
    at = m.end() + nxt.start() if nxt else len(doc_text)
    head = doc_text[:at].rstrip("\n") + "\n\n"
    tail = doc_text[at:]
    return head + part + "\n" + ("\n" + tail if tail else "")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", required=True, help="peer JSON lines")
    p.add_argument("--mptc", action="append", default=[], metavar="MODEL=FILE", help="mptc bench --json output")
    p.add_argument("--doc", required=True)
    p.add_argument("--png", required=True, help="chart path (relative links are made from the doc's folder)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--machine", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--date", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--note", action="append", default=[])
    p.add_argument("--busy-round", action="append", type=int, default=[], metavar="N",
                   help="a round that `mptc devices --quiet-check` found busy (its cells are marked)")
    a = p.parse_args()

    rows = []
    for spec in a.mptc:
        model, _, path = spec.partition("=")
        model, _, rnd = model.partition("@")  # MODEL@ROUND=FILE, or MODEL=FILE
        try:
            rows += mptc_rows(model, path, int(rnd) if rnd else None)
        except (OSError, ValueError, KeyError) as e:
            a.note.append(f"mptc {model}: no results ({e})")
    rows += load_rows(a.rows) if os.path.exists(a.rows) else []
    if not rows:
        print("report: no results to write", file=sys.stderr)
        return 1
    busy = set(a.busy_round)
    rows = fastest_rounds(rows, busy)
    n_busy = sum(1 for r in rows if r["busy"])
    if n_busy:
        a.note.insert(0, f"{BUSY_MARK}: measured only in rounds that `mptc devices --quiet-check` found busy "
                         f"(round{'s' if len(busy) > 1 else ''} {', '.join(map(str, sorted(busy)))}: every "
                         "core's FMA rate well below the core count times one core's, so another load "
                         "shared the cores): not a figure for this host; rerun on a quiet machine")
    text, cols, keys = table(rows)
    os.makedirs(os.path.dirname(os.path.abspath(a.png)), exist_ok=True)
    title = f"Training step time, {a.device}, {a.threads} threads ({a.date}, {a.commit})"
    note = chart(rows, cols, keys, a.png, title)
    rel = os.path.relpath(os.path.abspath(a.png), os.path.dirname(os.path.abspath(a.doc)))
    heading = "CPU" if a.device == "cpu" else "GPU"
    body = [f"### {heading}: {a.machine}, {a.threads} threads", "",
            f"Measured {a.date} at commit `{a.commit}` with `make bench-peers`.", ""]
    if n_busy:
        body += [f"**Measured on a busy host: {n_busy} of {len(rows)} cells (marked {BUSY_MARK}) come "
                 "only from rounds that the quiet check failed.**", ""]
    body += [text, ""]
    body += [f"![ms per step, {a.device}]({rel})", ""] if note is None else [f"({note})", ""]
    notes = list(dict.fromkeys(a.note + setups(rows) + failures(rows)))  # once each, across rounds
    if notes:
        body += ["Notes:", ""] + [n if n.startswith("- ") else f"- {n}" for n in notes] + [""]
    old = open(a.doc).read() if os.path.exists(a.doc) else "# Benchmarks\n"
    with open(a.doc, "w") as f:
        f.write(replace_part(old, a.device, "\n".join(body)))
    print(text)
    print(f"report: wrote the {a.device} part of the Peers section of {a.doc}" +
          (f" and {a.png}" if note is None else f" ({note})"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
