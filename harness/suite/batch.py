"""The compact grammar of serving batches: length distributions and mixed batches of requests, drawn from a seed.

A batch is terms joined by `+`; a term is `[N x] Q [@ KV]`: N requests whose query lengths are drawn
from Q and whose KV lengths are drawn from KV (absent: KV = Q, a prefill attending to its own prompt).
Q and KV are length distributions:

    512                 constant
    uniform(64,512)     uniform on the integers 64…512
    longtail(16,4096)   truncated Pareto on 16…4096 (shape 1.5; `longtail(16,4096,1.1)` for a heavier tail)
    bimodal(64,2048,0.1)  2048 with probability 0.1, else 64
    file:NAME           drawn (with replacement) from a user's file of lengths: one length per line, or
                        `length count` lines (a production histogram); `#` starts a comment

Examples: `2x2048 + 32x1@1024` (2 prefills of 2048 tokens, 32 decodes of 1 token over a 1024-token
cache), `4x512@4096` (chunked prefill: 512-token chunks over a 4096-token cache), `16x4@2048` with a
causal case (speculative decoding: 4 draft tokens, causal among themselves, over the cache),
`uniform(64,512)` (one bare distribution: the case's B says how many requests). KV is the whole key
length a request's queries attend to (its cache and itself), so it is at least Q: a drawn KV below
the request's Q is raised to it.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from harness.errors import UserError

#: Longtail's default Pareto shape: a heavy tail (most requests short, a few near the cap), as prompt lengths are.
LONGTAIL_SHAPE = 1.5
#: The most requests one batch may hold, and the largest lengths file read.
MAX_REQUESTS = 1 << 20
MAX_LENGTHS_FILE_BYTES = 16 * 2**20
#: Decimals a probability or shape may be written with: the canonical text is then exact.
DECIMALS = 6

_DIST = re.compile(r"^(uniform|longtail|bimodal)\((.*)\)$")
_TERM = re.compile(r"^(?:(\d+)x)?([^@]+?)(?:@(.+))?$")


def _fmt(value: float) -> str:
    """A float written exactly and without an exponent (the text goes into case ids, where '-' separates tokens)."""
    return f"{value:.{DECIMALS}f}".rstrip("0").rstrip(".")


def _positive(text: str, what: str) -> int:
    """A positive integer written in ASCII digits, or UserError naming `what`."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 18 or int(text) < 1:
        raise UserError(f"{what}: {text!r} is not a positive integer")
    return int(text)


def _fraction(text: str, what: str, low: float, high: float) -> float:
    """A number in (low, high) with at most DECIMALS decimals, or UserError naming `what`."""
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{what}: {text!r} is not a number") from None
    if not (math.isfinite(value) and low < value < high):
        raise UserError(f"{what}: {text!r} must be between {low:g} and {high:g} (exclusive)")
    if float(_fmt(value)) != value:
        raise UserError(f"{what}: {text!r} has more than {DECIMALS} decimals")
    return value


@dataclass(frozen=True)
class LengthsFile:
    """A user's histogram of lengths: distinct lengths, how often each occurs, and a short hash of both."""

    name: str
    lengths: tuple[int, ...]
    counts: tuple[int, ...]


def read_lengths_file(path: str | os.PathLike) -> LengthsFile:
    """Read a lengths file (`length` or `length count` per line, `#` comments); UserError naming the bad line."""
    path = Path(path)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError as exc:
        # Only a name that is truly absent "does not exist": a loop, a refusal or a too-long name is named as what it is.
        denied = "cannot be reached: permission denied (on the file or a folder on its path)"
        why = {errno.ENOENT: "does not exist", errno.ELOOP: "is a loop of symbolic links (or a folder on its path is)",
               errno.ENAMETOOLONG: "has a name too long for the file system (a part over 255 bytes, or the whole over 4096)",
               errno.EACCES: denied, errno.EPERM: denied, errno.ENOTDIR: "cannot be reached: a part of its path is a file, not a folder",
               }.get(exc.errno, f"cannot be read: {exc.strerror or exc}")
        if exc.errno == errno.ENOENT and os.path.islink(path):
            why = f"is a symbolic link to {os.readlink(path)}, which does not exist"
        raise UserError(f"lengths file {path} {why}") from None
    return _read_lengths_file(str(path), stamp)


@functools.lru_cache(maxsize=64)
def _read_lengths_file(path: str, stamp: int) -> LengthsFile:
    from harness.files import read_regular

    raw = read_regular(path, "lengths file", MAX_LENGTHS_FILE_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"lengths file {path}: byte {exc.start} is not UTF-8 text") from None
    histogram: dict[int, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) > 2:
            raise UserError(f"lengths file {path} line {number}: {line.strip()!r} is not 'length' or 'length count'")
        length = _positive(words[0], f"lengths file {path} line {number}: length")
        count = _positive(words[1], f"lengths file {path} line {number}: count") if len(words) == 2 else 1
        histogram[length] = histogram.get(length, 0) + count
    if not histogram:
        raise UserError(f"lengths file {path} holds no lengths (one length per line, or 'length count' lines)")
    ordered = sorted(histogram)
    return LengthsFile(Path(path).name, tuple(ordered), tuple(histogram[n] for n in ordered))


@dataclass(frozen=True)
class Lengths:
    """One length distribution: its kind, its parameters and its canonical text."""

    kind: str
    params: tuple
    #: For `file:`, the histogram read from the path (the path as written is the parameter); None when not read.
    source: LengthsFile | None = None

    @property
    def text(self) -> str:
        """The canonical text: `512`, `uniform(64,512)`, `longtail(16,4096)`, `bimodal(64,2048,0.1)`, `file:NAME`."""
        if self.kind == "constant":
            return str(self.params[0])
        if self.kind == "file":
            return f"file:{self.params[0]}"
        params = list(self.params)
        if self.kind == "longtail" and params[2] == LONGTAIL_SHAPE:
            params = params[:2]
        return f"{self.kind}({','.join(p if isinstance(p, str) else _fmt(p) if isinstance(p, float) else str(p) for p in params)})"

    @property
    def id_text(self) -> str:
        """The text a case id carries: the canonical one with `_` for `,` (`--case` lists ids by commas); a file by its name's
        safe characters (the id adds the lengths' hash)."""
        if self.kind != "file":
            return self.text.replace(",", "_")
        return "file:" + re.sub(r"[^A-Za-z0-9_.]+", "_", Path(self.params[0]).name)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` lengths (int64) from this distribution."""
        if self.kind == "constant":
            return np.full(n, self.params[0], dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.params[0], self.params[1] + 1, size=n).astype(np.int64)
        if self.kind == "bimodal":
            short, long, p = self.params
            return np.where(rng.random(n) < p, long, short).astype(np.int64)
        if self.kind == "longtail":
            low, high, shape = self.params
            # Inverse CDF of a Pareto(shape) truncated to [low, high]: exact, nothing clipped or redrawn.
            u = rng.random(n)
            x = low / (1.0 - u * (1.0 - (low / high) ** shape)) ** (1.0 / shape)
            return np.clip(np.floor(x), low, high).astype(np.int64)
        if self.source is None:
            raise UserError(f"{self.text}: the lengths file was not read, so no lengths can be drawn from it")
        weights = np.asarray(self.source.counts, dtype=np.float64)
        return rng.choice(np.asarray(self.source.lengths, dtype=np.int64), size=n, p=weights / weights.sum())


def parse_lengths(text: str, base: Path | None = None, *, read: bool = True, files: Mapping[str, Path] | None = None) -> Lengths:
    """A length distribution from its text (see the module docstring).

    `file:` paths are relative to `base` (default: the working directory), or read where `files` maps them (a run's
    frozen copies); with `read` False the file is named but not read (a case's own text is checked so, since the case
    carries the lengths drawn from it).
    """
    text = text.strip()
    if text.startswith("file:"):
        name = text[5:].strip()
        if not name:
            raise UserError("file: names no lengths file (write file:PATH)")
        if not read:
            return Lengths("file", (name,))
        path = Path(name) if base is None or Path(name).is_absolute() else base / name
        return Lengths("file", (name,), read_lengths_file(files.get(name, path) if files else path))
    if text.isascii() and text.isdigit():
        return Lengths("constant", (_positive(text, "length"),))
    constant = re.fullmatch(r"constant\((\d+)\)", text.replace(" ", ""))
    if constant:  # the issue's own word for it; written N
        return Lengths("constant", (_positive(constant.group(1), "length"),))
    match = _DIST.match(text.replace(" ", ""))
    if not match:
        raise UserError(f"length distribution {text!r}: expected N or constant(N), uniform(lo,hi), longtail(lo,hi[,shape]), bimodal(a,b,p) or file:PATH")
    kind, args = match.group(1), match.group(2).split(",")
    where = f"{kind}({match.group(2)})"
    wanted = {"uniform": (2,), "longtail": (2, 3), "bimodal": (3,)}[kind]
    if len(args) not in wanted:
        raise UserError(f"{where}: takes {' or '.join(map(str, wanted))} arguments, got {len(args)}")
    low, high = _positive(args[0], f"{where} first length"), _positive(args[1], f"{where} second length")
    if kind == "bimodal":
        return Lengths(kind, (low, high, _fraction(args[2], f"{where} probability", 0.0, 1.0)))
    if low > high:
        raise UserError(f"{where}: the lower bound {low} is above the upper bound {high}")
    if kind == "uniform":
        return Lengths(kind, (low, high))
    shape = _fraction(args[2], f"{where} shape", 0.0, 1e6) if len(args) == 3 else LONGTAIL_SHAPE
    return Lengths(kind, (low, high, shape))


@dataclass(frozen=True)
class Term:
    """`count` requests (None: the case's B) with query lengths from `q` and KV lengths from `kv` (None: KV = Q)."""

    count: int | None
    q: Lengths
    kv: Lengths | None

    def text(self, id_form: bool = False) -> str:
        """The term's canonical text (or the form a case id carries)."""
        q, kv = (self.q.id_text, self.kv and self.kv.id_text) if id_form else (self.q.text, self.kv and self.kv.text)
        return (f"{self.count}x" if self.count is not None else "") + q + (f"@{kv}" if kv else "")


@dataclass(frozen=True)
class Batch:
    """A parsed batch description: its terms in order."""

    terms: tuple[Term, ...]

    @property
    def text(self) -> str:
        """The canonical text, terms joined by ' + '."""
        return " + ".join(t.text() for t in self.terms)

    @property
    def id_text(self) -> str:
        """The text a case id carries: no spaces, files by name and hash."""
        return "+".join(t.text(id_form=True) for t in self.terms)

    @property
    def from_file(self) -> bool:
        """Whether some lengths come from a user's file (a case id then cannot rebuild them alone)."""
        return any(d is not None and d.kind == "file" for t in self.terms for d in (t.q, t.kv))

    def requests(self, B: int | None = None) -> int:
        """How many requests the batch holds; a bare single distribution takes `B`."""
        if self.terms[0].count is None:
            if B is None:
                raise UserError(f"batch {self.text!r} gives no count: write Nx{self.text} or give B")
            return B
        return sum(t.count for t in self.terms)

    def draw(self, seed: int, B: int | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Per-request (query lengths, KV lengths), drawn from `seed`; KV is raised to Q where a draw falls below it."""
        rng = np.random.default_rng([seed, 0xBA7C])
        q_lens, kv_lens = [], []
        for term in self.terms:
            n = self.requests(B) if term.count is None else term.count
            q = term.q.draw(rng, n)
            kv = q if term.kv is None else np.maximum(term.kv.draw(rng, n), q)
            q_lens.extend(q.tolist())
            kv_lens.extend(kv.tolist())
        return tuple(q_lens), tuple(kv_lens)


def parse_batch(text: str, base: Path | None = None, *, read: bool = True, files: Mapping[str, Path] | None = None) -> Batch:
    """A batch description (see the module docstring) parsed; UserError naming the term that is wrong (`read`, `files`: see parse_lengths)."""
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"batch description {text!r} is empty: write e.g. '2x2048 + 32x1@1024' or 'uniform(64,512)'")
    pieces = [p.strip() for p in text.split("+")]
    terms = []
    for piece in pieces:
        match = _TERM.match(piece.replace(" ", ""))
        if not piece or not match:
            raise UserError(f"batch {text!r}: term {piece!r} is not [Nx]LENGTHS[@KV_LENGTHS]")
        count = _positive(match.group(1), f"batch {text!r}: count of {piece!r}") if match.group(1) else None
        if count is None and len(pieces) > 1:
            raise UserError(f"batch {text!r}: term {piece!r} needs a count (Nx…) in a batch of several terms")
        q = parse_lengths(match.group(2), base, read=read, files=files)
        kv = parse_lengths(match.group(3), base, read=read, files=files) if match.group(3) else None
        if kv is not None and q.kind == kv.kind == "constant" and kv.params[0] < q.params[0]:
            raise UserError(f"batch {text!r}: term {piece!r} attends over {kv.params[0]} keys, fewer than its {q.params[0]} queries "
                            f"(KV counts the cache and the queries themselves)")
        terms.append(Term(count, q, kv))
    batch = Batch(tuple(terms))
    if batch.terms[0].count is not None and batch.requests() > MAX_REQUESTS:
        raise UserError(f"batch {text!r} holds {batch.requests():,} requests, more than {MAX_REQUESTS:,}")
    return batch


def lengths_digest(seq_lens_q: tuple[int, ...], seq_lens_kv: tuple[int, ...]) -> str:
    """Eight hex digits of SHA-256 over a batch's lengths: what a case id drawn from a user's file carries instead of them."""
    text = ",".join(map(str, seq_lens_q)) + ";" + ",".join(map(str, seq_lens_kv))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def from_id_text(text: str) -> Batch:
    """The batch a case id's `L` token names (its `_` are the canonical text's `,`); files named, not read."""
    return parse_batch(text.replace("_", ","), read=False)


@functools.lru_cache(maxsize=1024)
def case_batch(length_dist: str) -> Batch:
    """A case's own `length_dist` parsed without reading files (cached: cases are rebuilt once per record)."""
    return parse_batch(length_dist, read=False)
