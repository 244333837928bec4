"""ServeGen per-client window traces → request arrivals.

ServeGen (Alibaba, "ServeGen: Workload Characterization of Large Language Model Serving in
Production", github.com/alibaba/ServeGen) publishes workloads not as requests but as per-client
windows: for each client and each window, the request rate, the inter-arrival CV and a fitted
inter-arrival distribution (Gamma or Weibull, shape and scale). We read two layouts:

1. **Native ServeGen** (`data/<category>/<model>/chunk-<client>-trace.csv`): headerless rows
   `window_start_s,rate,cv,dist,shape,scale`, e.g. `1200,0.273,6.01,Weibull,0.495,3.38`; a window
   with no traffic is `600,0,0,,0,0`. A window lasts until the next row's start (the last one as long
   as the one before it). Lengths come from the sibling `chunk-<client>-dataset.json` when present:
   `{"<window_start>": {"input_tokens": "{tokens: probability, ...}", "output_tokens": "..."}}`,
   each window using the latest distribution that starts at or before it; otherwise lognormal with
   `mean_input_tokens` / `mean_output_tokens`. A folder of such files is read as a client pool.
2. **Documented window CSV** (our own, with a header), for users who summarise their traffic the
   same way: `client_id,window_start_s,window_s,rate,cv,dist,mean_input_tokens,mean_output_tokens`
   plus optional `shape,scale`. `dist` is `gamma` or `weibull` (any case; empty when rate is 0).
   Without `shape` the distribution's shape is derived from `cv`.

Arrivals follow ServeGen's own generator (`servegen/construct.py`): a window with rate r and length
w draws ceil(r * w) inter-arrival times from its fitted distribution, rescales them to sum to w (so
the window keeps its rate while the fitted shape sets the burstiness) and keeps the arrivals inside
the window. Only windows overlapping `span` are generated, so a day-long pool costs only the slice
a workload uses.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autospec.errors import InputError, parse_json
from autospec.workloads._io import first_line, read_text
from autospec.workloads._table import Table, read_table
from autospec.workloads.synthetic import MAX_REQUESTS, lognormal_lengths
from autospec.workloads.trace import Trace

NATIVE_COLUMNS = ("window_start_s", "rate", "cv", "dist", "shape", "scale")
HEADER_COLUMNS = ("client_id", "window_start_s", "window_s", "rate", "cv", "dist", "mean_input_tokens",
                  "mean_output_tokens")
DISTRIBUTIONS = ("gamma", "weibull")
_CHUNK = re.compile(r"chunk-(\d+)-trace\.csv$")


@dataclass(frozen=True)
class Window:
    """One client's traffic in one window."""

    client_id: int
    start_s: float
    length_s: float
    rate: float
    cv: float
    dist: str  # "" when the window has no traffic
    shape: float | None
    lengths: "_Lengths"


@dataclass(frozen=True)
class _Lengths:
    """Where a window's token counts come from: discrete distributions, or lognormal means."""

    input_pdf: tuple[np.ndarray, np.ndarray] | None = None  # (values, probabilities)
    output_pdf: tuple[np.ndarray, np.ndarray] | None = None
    mean_input: float = 512.0
    mean_output: float = 128.0

    def draw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        def one(pdf, mean):
            if pdf is None:
                return lognormal_lengths(mean, n, rng)
            return np.maximum(1, rng.choice(pdf[0], size=n, p=pdf[1]))
        return one(self.input_pdf, self.mean_input), one(self.output_pdf, self.mean_output)


def is_servegen_header(first_line: str) -> bool:
    """Whether a CSV's first line is our documented window header."""
    return {c.strip() for c in first_line.split(",")} >= set(HEADER_COLUMNS)


def load_servegen(path: str | Path, *, seed: int = 0, domain: str = "chat", span: tuple[float, float] | None = None,
                  mean_input_tokens: float = 512.0, mean_output_tokens: float = 128.0) -> Trace:
    """Requests generated from a ServeGen window file, a folder of them, or our documented window CSV.

    `span` = (start_s, end_s) limits generation to windows overlapping it (times stay absolute; the
    caller windows the trace). Bad rows raise InputError naming the file and line.
    """
    path = Path(path)
    if path.is_dir():
        files = sorted((p for p in path.iterdir() if _CHUNK.search(p.name)), key=lambda p: _client_id(p))
        if not files:
            raise InputError("no ServeGen chunk-<client>-trace.csv files in folder", path=path)
        windows = [w for f in files for w in _native_windows(f, mean_input_tokens, mean_output_tokens)]
    else:
        if not _is_number(first_line(path).split(",")[0]):  # native files have no header; ours must
            windows = _header_windows(path)
        else:
            windows = _native_windows(path, mean_input_tokens, mean_output_tokens)
    return _generate(windows, np.random.default_rng(seed), domain, span, path)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _client_id(path: Path) -> int:
    match = _CHUNK.search(path.name)
    return int(match.group(1)) if match else 0


def _native_windows(path: Path, mean_input: float, mean_output: float) -> list[Window]:
    table = read_table(path, NATIVE_COLUMNS, header=False, names=NATIVE_COLUMNS)
    starts = table.numbers("window_start_s")
    table.raise_first([(np.diff(starts, prepend=-np.inf) <= 0, lambda i: "window starts must increase")],
                      "window_start_s")
    lengths = np.diff(starts, append=starts[-1] + (starts[-1] - starts[-2] if len(starts) > 1 else 600.0))
    rate, cv, dist, shape = _fit_columns(table, shape_required=True)
    client = _client_id(path)
    dataset = _read_dataset(path.with_name(f"chunk-{client}-dataset.json"), mean_input, mean_output)
    default = _Lengths(mean_input=mean_input, mean_output=mean_output)
    windows = []
    for i in range(len(table)):
        earlier = [t for t in dataset if t <= starts[i]]
        lens = dataset[max(earlier)] if earlier else default
        windows.append(Window(client, float(starts[i]), float(lengths[i]), float(rate[i]), float(cv[i]), dist[i],
                              None if np.isnan(shape[i]) else float(shape[i]), lens))
    return windows


def _header_windows(path: Path) -> list[Window]:
    table = read_table(path, HEADER_COLUMNS)
    client = table.numbers("client_id", whole=True)
    starts = table.numbers("window_start_s")
    length = table.numbers("window_s", minimum=None)
    table.raise_first([(length <= 0, lambda i: "window_s must be > 0")], "window_s")
    rate, cv, dist, shape = _fit_columns(table, shape_required=False)
    mean_in = table.numbers("mean_input_tokens", minimum=1)
    mean_out = table.numbers("mean_output_tokens", minimum=1)
    return [Window(int(client[i]), float(starts[i]), float(length[i]), float(rate[i]), float(cv[i]), dist[i],
                   None if np.isnan(shape[i]) else float(shape[i]),
                   _Lengths(mean_input=float(mean_in[i]), mean_output=float(mean_out[i])))
            for i in range(len(table))]


def _fit_columns(table: Table, *, shape_required: bool):
    """rate, cv, dist (lower case, "" for idle windows) and shape (NaN: derive from cv).

    A fitted scale is checked but not used: rescaling each window's draws to its length cancels it.
    """
    rate = table.numbers("rate")
    cv = table.numbers("cv")
    dist = table.text("dist").str.lower().to_numpy(dtype=object)
    busy = rate > 0
    table.raise_first([
        (busy & (dist == ""), lambda i: "a window with rate > 0 needs dist (gamma or weibull)"),
        (busy & ~np.isin(dist, DISTRIBUTIONS) & (dist != ""),
         lambda i: f"dist must be gamma or weibull, got {table.text('dist').iloc[i]!r}"),
    ], "dist")
    dist = np.where(busy, dist, "")
    has_shape = "shape" in table.frame.columns
    if shape_required or has_shape:
        shape = table.numbers("shape")
        if "scale" in table.frame.columns:
            table.numbers("scale")
        table.raise_first([(busy & (shape <= 0), lambda i: "shape must be > 0 for a window with traffic")], "shape")
    else:
        shape = np.full(len(table), np.nan)
    return rate, cv, list(dist), shape


def _read_dataset(path: Path, mean_input: float, mean_output: float) -> dict[float, _Lengths]:
    """Window start → length distributions from a ServeGen dataset file; {} when there is none."""
    if not path.exists():
        return {}
    data = parse_json(read_text(path), path=path)
    if not isinstance(data, dict):
        raise InputError("expected a JSON object of window start → length distributions", path=path)
    out: dict[float, _Lengths] = {}
    for key, fields in data.items():
        try:
            start = float(key)
        except ValueError:
            raise InputError(f"window key must be a number of seconds, got {key!r}", path=path, field=key) from None
        if not isinstance(fields, dict):
            raise InputError("expected an object of length distributions", path=path, field=key)
        pdfs = {name: _pdf(fields[name], path, f"{key}.{name}") for name in ("input_tokens", "output_tokens")
                if name in fields}
        if any(p is None for p in pdfs.values()):
            continue  # ServeGen itself skips windows with an empty distribution
        out[start] = _Lengths(pdfs.get("input_tokens"), pdfs.get("output_tokens"), mean_input, mean_output)
    return out


def _pdf(value, path: Path, field: str) -> tuple[np.ndarray, np.ndarray] | None:
    """{tokens: probability} (ServeGen stores it as a Python dict literal in a string) → arrays."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)  # literals only: no code runs, unlike ServeGen's own eval()
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise InputError("length distribution is not a {tokens: probability} literal", path=path,
                             field=field) from None
    if not isinstance(value, dict):
        raise InputError("length distribution must be a {tokens: probability} mapping", path=path, field=field)
    if not value:
        return None
    try:
        tokens = np.array([float(k) for k in value], dtype=float)
        probs = np.array([float(v) for v in value.values()], dtype=float)
    except (TypeError, ValueError):
        raise InputError("length distribution keys and values must be numbers", path=path, field=field) from None
    if not (np.all(np.isfinite(tokens)) and np.all(tokens >= 0) and np.all(np.isfinite(probs))
            and np.all(probs >= 0) and probs.sum() > 0):
        raise InputError("length distribution needs token counts >= 0 and probabilities >= 0 summing to > 0",
                         path=path, field=field)
    return np.rint(tokens).astype(np.int64), probs / probs.sum()


def _generate(windows: list[Window], rng: np.random.Generator, domain: str, span: tuple[float, float] | None,
              path: Path) -> Trace:
    arrivals, prompts, outputs = [], [], []
    asked = 0.0
    for w in windows:
        if not w.dist or w.rate <= 0:
            continue
        if span is not None and (w.start_s + w.length_s <= span[0] or w.start_s >= span[1]):
            continue
        asked += w.rate * w.length_s  # checked before drawing: a rate of 1e10 once asked for 43 TiB
        if asked > MAX_REQUESTS:
            raise InputError(f"the windows' rate x length asks for more than {MAX_REQUESTS:,} requests (window at "
                             f"{w.start_s:g} s: rate {w.rate:g}/s)", path=path, field="rate")
        times = w.start_s + _window_arrivals(w, rng)
        p, o = w.lengths.draw(len(times), rng)
        arrivals.append(times)
        prompts.append(p)
        outputs.append(o)
    if not arrivals:
        raise InputError("the ServeGen windows hold no traffic" + (" in the requested span" if span else ""),
                         path=path)
    return Trace.from_arrays(np.concatenate(arrivals), np.concatenate(prompts), np.concatenate(outputs), domain,
                             name=path.name)


def _window_arrivals(w: Window, rng: np.random.Generator) -> np.ndarray:
    """Offsets in [0, length) of one window's arrivals (ServeGen's rescaled-IAT construction)."""
    n = math.ceil(w.rate * w.length_s)
    shape = w.shape if w.shape is not None else _shape_for_cv(w.dist, w.cv)
    if shape is None:  # cv 0: evenly spaced
        iats = np.ones(n)
    elif w.dist == "gamma":
        iats = rng.gamma(shape, 1.0, n)
    else:
        iats = rng.weibull(shape, n)
    total = iats.sum()
    if total <= 0:  # every draw underflowed to 0 (tiny shapes): fall back to even spacing
        iats, total = np.ones(n), float(n)
    times = np.cumsum(iats * (w.length_s / total))
    return times[times < w.length_s]


def _shape_for_cv(dist: str, cv: float) -> float | None:
    """The shape parameter that gives inter-arrival CV `cv` (scale does not matter after rescaling)."""
    if cv <= 0:
        return None
    if dist == "gamma":
        return 1.0 / cv**2
    # lazily: scipy costs ~0.5 s, and every workload spec imports this module (docs/architecture.md, "Imports")
    from scipy import optimize, special

    def weibull_cv(k: float) -> float:  # CV^2 = Gamma(1 + 2/k) / Gamma(1 + 1/k)^2 - 1, in logs for small k
        return math.sqrt(math.expm1(special.gammaln(1 + 2 / k) - 2 * special.gammaln(1 + 1 / k))) - cv

    # CV falls monotonically in k; the bracket covers CV from about 1e-2 up to ~1e6.
    lo, hi = 0.02, 200.0
    if weibull_cv(lo) < 0:
        return lo
    if weibull_cv(hi) > 0:
        return hi
    return float(optimize.brentq(weibull_cv, lo, hi))
