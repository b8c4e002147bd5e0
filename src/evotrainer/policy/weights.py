"""Trusted side: are a checkpoint's weights ones the evaluator can load on the run's base?

A job writes its checkpoint's files, so before the evaluator loads one the controller can
ask `check_weights`: it reads the safetensors headers only (an 8-byte little-endian length,
then that many bytes of JSON naming each tensor's dtype, shape and byte span), never a
tensor, and imports neither torch nor transformers. The evaluator loads a checkpoint's
weights onto the base's architecture (policy/model.py, load_policy), so a tensor the base
lacks, a shape it does not have, or a span past the file's end would fail that load; here
each is one line, said before the evaluator starts.

A checkpoint's own files are opened relative to its directory with O_NOFOLLOW: no link is
followed, and only regular files are read (a FIFO would block the reader). The base is the
user's: its files may be links (a Hugging Face cache snapshot's are).
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from pathlib import Path

MAX_HEADER = 100 * 2 ** 20  # the JSON header of a safetensors file, in bytes (safetensors' own cap)
MAX_INDEX = 2 ** 24
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
            "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
FLOATS = ("F32", "BF16", "F16")  # what a training job saves weights in (the run's `weights`, or an adapter's)
WEIGHTS = {"fp32": "F32", "bf16": "BF16"}  # PolicyConfig.weights -> the safetensors dtype a checkpoint holds
SINGLE, INDEX, ADAPTER = "model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors"
LORA_NAME = re.compile(r"base_model\.model\.(.+)\.lora_([AB])\.weight")  # PEFT's names in a saved adapter
TIED = "lm_head.weight"  # absent from a tied model's file, present in some saved bases


class Refused(Exception):
    """Why the weights are refused, in one line."""


Tensors = dict  # tensor name -> (dtype, shape)


def check_weights(checkpoint: Path | str, base: Path | str, weights: str | None = None,
                  rank: int | None = None) -> str | None:
    """None if `checkpoint`'s weights load on the base `base`, else a one-line reason.

    Whole weights: the file transformers would load (model.safetensors, else the shards of
    model.safetensors.index.json) names exactly the base's tensors with the base's shapes,
    each a float where the base's is (the run's `weights` dtype, "fp32" or "bf16", where given:
    the checkpoint is saved in it, whatever the base's file holds), and every file's tensors
    tile its data exactly (file size = 8 + header length + the last tensor's end).
    A LoRA adapter (adapter_model.safetensors): LoRA names only (lora_A, lora_B) of linear
    modules the base has, floats, shapes that fit those modules, one rank (the run's `rank`
    where given). Its adapter_config.json is not read: the evaluator uses the run's `lora:`.
    The base itself (the same directory) passes: it is the user's, loaded as it is."""
    checkpoint, base = Path(checkpoint), Path(base)
    same = checkpoint.absolute() == base.absolute()
    if same or (not checkpoint.is_symlink() and checkpoint.resolve() == base.resolve()):
        return None  # (a link to the base is a job's checkpoint: refused below)
    try:
        want = _whole(base, follow=True)
    except Refused as e:
        return f"the base '{_shown(base)}': {e}"
    try:
        fd = _open_dir(checkpoint)
        try:
            if _exists(ADAPTER, fd):
                _check_adapter(_header(ADAPTER, fd), want, rank)
            else:
                _check_whole(_whole(fd, follow=False), want, weights, _tied(base))
        finally:
            os.close(fd)
    except Refused as e:
        return f"checkpoint '{_shown(checkpoint)}': {e}"
    return None


def _check_whole(got: Tensors, want: Tensors, weights: str | None, tied: bool) -> None:
    optional = {n for n in (got.keys() | want.keys()) if tied and n.split(".")[-2:] == TIED.split(".")}
    extra, missing = sorted(got.keys() - want.keys() - optional), sorted(want.keys() - got.keys() - optional)
    if extra or missing:
        said = [f"{len(names)} {what} ('{_shown(names[0])}'{', ...' if len(names) > 1 else ''})"
                for names, what in ((extra, "not the base's"), (missing, "of the base's missing")) if names]
        raise Refused(f"its tensors are not the base's: {', '.join(said)}")
    for name in sorted(got.keys() & want.keys()):
        (dtype, shape), (base_dtype, base_shape) = got[name], want[name]
        if shape != base_shape:
            raise Refused(f"tensor '{_shown(name)}' has shape {list(shape)}, the base's {list(base_shape)}")
        if base_dtype in FLOATS + ("F64",):
            allowed = (WEIGHTS[weights],) if weights in WEIGHTS else FLOATS
        else:
            allowed = (base_dtype,)
        if dtype not in allowed:
            raise Refused(f"tensor '{_shown(name)}' is {dtype}, expected {' or '.join(allowed)}")


def _check_adapter(got: Tensors, want: Tensors, rank: int | None) -> None:
    if not got:
        raise Refused(f"{ADAPTER} holds no tensor")
    halves: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, (dtype, shape) in sorted(got.items()):
        m = LORA_NAME.fullmatch(name)
        if m is None:
            raise Refused(f"{ADAPTER}: tensor '{_shown(name)}' is not a LoRA weight (lora_A or lora_B of a module)")
        module, half = m.groups()
        target = want.get(f"{module}.weight")
        if target is None or len(target[1]) != 2:
            raise Refused(f"{ADAPTER}: '{_shown(name)}' adapts no linear module of the base")
        if dtype not in FLOATS:
            raise Refused(f"{ADAPTER}: tensor '{_shown(name)}' is {dtype}, not a float")
        if len(shape) != 2:
            raise Refused(f"{ADAPTER}: tensor '{_shown(name)}' has shape {list(shape)}, not a matrix")
        halves.setdefault(module, {})[half] = shape
    ranks = set()
    for module, h in sorted(halves.items()):
        if set(h) != {"A", "B"}:
            raise Refused(f"{ADAPTER}: module '{_shown(module)}' has lora_{next(iter(h))} without its other half")
        (r, fan_in), (fan_out, r_b) = h["A"], h["B"]
        base_shape = want[f"{module}.weight"][1]
        if r != r_b or (fan_out, fan_in) not in (base_shape, base_shape[::-1]):
            raise Refused(f"{ADAPTER}: module '{_shown(module)}' has lora_A {list(h['A'])} and lora_B {list(h['B'])}, "
                          f"which do not fit its weight {list(base_shape)}")
        ranks.add(r)
    if len(ranks) > 1:
        raise Refused(f"{ADAPTER}: its modules have ranks {', '.join(map(str, sorted(ranks)))}, not one")
    if rank is not None and ranks != {rank}:
        raise Refused(f"{ADAPTER}: rank {ranks.pop()}, the run's lora rank is {rank}")


def _whole(where, follow: bool) -> Tensors:
    """The tensors transformers loads from a whole model's directory (`where`: a path, or
    an open directory's fd): model.safetensors if there, else the index's shards."""
    if _exists(SINGLE, where):
        return _header(SINGLE, where, follow)
    if not _exists(INDEX, where):
        raise Refused(f"neither {SINGLE} nor {INDEX}")
    weight_map = _index(where, follow)
    out: Tensors = {}
    for shard in sorted(set(weight_map.values())):
        for name, t in _header(shard, where, follow).items():
            if weight_map.get(name) != shard:
                raise Refused(f"{_shown(shard)}: tensor '{_shown(name)}' is not listed there in {INDEX}")
            out[name] = t
    for name in sorted(weight_map.keys() - out.keys()):
        raise Refused(f"{INDEX} lists tensor '{_shown(name)}', which its shard does not hold")
    return out


def _index(where, follow: bool) -> dict[str, str]:
    raw = _read(INDEX, where, follow, MAX_INDEX)
    try:
        weight_map = json.loads(raw)["weight_map"]
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise Refused(f"{INDEX} is not an index ({type(e).__name__})") from None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and "/" not in v and v.endswith(".safetensors")
            for k, v in weight_map.items()):
        raise Refused(f"{INDEX}: its weight_map must map tensor names to .safetensors files of the checkpoint")
    return weight_map


def _header(name: str, where, follow: bool = False) -> Tensors:
    """name -> (dtype, shape) of a safetensors file, once its layout is checked: a JSON object
    of tensors whose byte spans tile the data after the header exactly."""
    fd = _open(name, where, follow)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise Refused(f"{name}: {size} bytes, shorter than a safetensors header")
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER:
            raise Refused(f"{name}: its header length, {n} bytes, is over {MAX_HEADER}")
        if 8 + n > size:
            raise Refused(f"{name}: its header length, {n} bytes, runs past the end of the file ({size} bytes)")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError too; RecursionError: nested past Python's stack
        raise Refused(f"{name}: its header is not JSON") from None
    if not isinstance(header, dict):
        raise Refused(f"{name}: its header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise Refused(f"{name}: its __metadata__ is not a map of strings")
    tensors, spans = {}, []
    for tname, t in header.items():
        dtype, shape, begin, end = _entry(name, tname, t)
        tensors[tname] = (dtype, shape)
        spans.append((begin, end, tname))
    at = 0
    for begin, end, tname in sorted(spans):
        if begin != at:
            raise Refused(f"{name}: tensor '{_shown(tname)}' starts at byte {begin} of the data, not {at} "
                          "(tensors must tile it)")
        at = end
    if 8 + n + at != size:
        raise Refused(f"{name}: the file is {size} bytes, its header says {8 + n + at} "
                      "(truncated, or bytes after the last tensor)")
    return tensors


def _entry(name: str, tname: str, t) -> tuple[str, tuple[int, ...], int, int]:
    """One header entry, checked: (dtype, shape, begin, end)."""
    ok = isinstance(t, dict) and t.get("dtype") in ITEMSIZE and isinstance(t.get("shape"), list) \
        and isinstance(t.get("data_offsets"), list) and len(t["data_offsets"]) == 2 \
        and all(type(x) is int and x >= 0 for x in t["shape"] + t["data_offsets"])
    if not ok:
        raise Refused(f"{name}: tensor '{_shown(tname)}' is not a safetensors entry (dtype, shape, data_offsets)")
    begin, end = t["data_offsets"]
    if end - begin != math.prod(t["shape"]) * ITEMSIZE[t["dtype"]]:
        raise Refused(f"{name}: tensor '{_shown(tname)}' spans bytes {begin}..{end}, not what {t['dtype']} "
                      f"{t['shape']} takes")
    return t["dtype"], tuple(t["shape"]), begin, end


def _tied(base: Path) -> bool:
    """Whether the base ties its output head to its embeddings (transformers' default: yes)."""
    try:
        cfg = json.loads(Path(base, "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and cfg.get("tie_word_embeddings", True) is True


def _open_dir(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:  # a link: ELOOP, or ENOTDIR as O_DIRECTORY is checked first
        raise Refused("is a symbolic link" if e.errno == errno.ELOOP or os.path.islink(path)
                      else f"is not a directory ({e.strerror})") from None


def _open(name: str, where, follow: bool) -> int:
    """An fd of a regular file `name` in `where` (a directory path, or an fd opened by _open_dir)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(name, flags, dir_fd=where) if isinstance(where, int) else os.open(Path(where, name), flags)
    except OSError as e:
        raise Refused(f"{_shown(name)} is a symbolic link" if e.errno == errno.ELOOP
                      else f"{_shown(name)} cannot be opened ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Refused(f"{_shown(name)} is not a regular file")
    return fd


def _read(name: str, where, follow: bool, cap: int) -> bytes:
    with os.fdopen(_open(name, where, follow), "rb") as f:
        raw = f.read(cap + 1)
    if len(raw) > cap:
        raise Refused(f"{name} is larger than {cap} bytes")
    return raw


def _exists(name: str, where) -> bool:
    """Whether `name` is an entry of the directory (a link counts: opening it then says why)."""
    try:
        os.stat(name, dir_fd=where, follow_symlinks=False) if isinstance(where, int) else os.lstat(Path(where, name))
    except OSError:
        return False
    return True


def _shown(name) -> str:
    """A name from a checkpoint's files, safe in a one-line message (a job chose it)."""
    return ascii(str(name))[1:-1][:120]
