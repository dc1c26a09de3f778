"""Pulse torch.distributed injection (put this directory on PYTHONPATH).

Python imports ``sitecustomize`` at start-up. This one

1. runs any other ``sitecustomize`` found later on ``sys.path`` (so it never shadows the
   job's or the distribution's own), then
2. only when ``PULSE_HOOK_DIR`` is set (and ``PULSE_TORCH_HOOKS`` is not ``0``), waits for
   ``torch.distributed`` to be imported by the job - it never imports torch itself - and
   wraps its collective entry points so that each call appends a Pulse ``op`` hook event
   (and a ``comm`` event on a group's first use) to
   ``$PULSE_HOOK_DIR/torch-<host>-<pid>.jsonl``.

Recording never raises into the training job: any failure is swallowed and, after a few,
recording switches itself off. Only the standard library is used here; the job's
environment need not have Pulse installed.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable


def _chain_other_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None or not spec.origin:
        return
    if os.path.abspath(spec.origin) == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_pulse_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _chain_other_sitecustomize()
except Exception as _exc:  # the chained file's own error; report it the way site.py would
    sys.stderr.write(f"Error in chained sitecustomize; set PYTHONVERBOSE for traceback:\n{_exc!r}\n")


def _active() -> bool:
    return bool(os.environ.get("PULSE_HOOK_DIR")) and os.environ.get("PULSE_TORCH_HOOKS", "1") != "0"


if _active():
    import functools
    import hashlib
    import importlib.abc
    import json
    import re
    import socket
    import threading
    import time
    import weakref

    _MAX_FAILURES = 20
    _DTYPES = {
        "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64",
        "uint64": "uint64", "float16": "float16", "float32": "float32", "float64": "float64",
        "bfloat16": "bfloat16", "float8_e4m3fn": "float8e4m3", "float8_e5m2": "float8e5m2",
    }
    _SIZES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "float16": 2,
              "float32": 4, "float64": 8, "bfloat16": 2, "float8e4m3": 1, "float8e5m2": 1, "bytes": 1}

    class _State(threading.local):
        busy = False
        capture = None  # inside a DDP comm hook: the ops it issues, completed by its future

    _tls = _State()
    _lock = threading.Lock()
    _out = {"fd": -1, "pid": -1, "failures": 0, "disabled": False}
    _refusals: dict[str, int] = {}  # why recording switched itself off -> how often
    _fds: dict[str, int] = {}  # record stream -> fd (ops/comms: "torch", completions: "oplevel")
    # Weak: a group the job destroyed must not live on to the interpreter's exit, where
    # torch's Gloo teardown sometimes aborts ("terminate called without an active exception").
    _groups: dict[int, tuple[Callable[[], object], dict]] = {}  # id -> (weak reference, info)
    _node = re.sub(r"[^A-Za-z0-9_.:@+-]", "_", os.environ.get("PULSE_NODE") or socket.gethostname())[:128] or "unknown"
    _job = re.sub(r"[^A-Za-z0-9_.:@+-]", "_", os.environ.get("PULSE_JOB", ""))[:128]

    _SAFE = re.compile(r"[A-Za-z0-9_.:@+-]*")

    def _encode(event: dict) -> str:
        # json.dumps costs several times this on the hot path; every string here is a fixed
        # token or a sanitised name and every list holds ints, so nothing needs escaping
        # (anything unexpected falls back to json).
        parts = []
        for k, v in event.items():
            kind = type(v)
            if kind is int:
                parts.append(f'"{k}":{v}')
            elif kind is str and _SAFE.fullmatch(v):
                parts.append(f'"{k}":"{v}"')
            elif kind is list:
                parts.append(f'"{k}":[{",".join(map(str, v))}]')
            else:
                return json.dumps(event, separators=(",", ":"))
        return "{" + ",".join(parts) + "}"

    def _forked() -> None:
        _out["fd"], _out["pid"] = -1, -1  # a forked child writes its own file
        _fds.clear()

    os.register_at_fork(after_in_child=_forked)

    def _refuse(reason: str) -> OSError:
        _out["disabled"] = True
        _refusals[reason] = _refusals.get(reason, 0) + 1
        return OSError(reason)

    def _create(name: str) -> int:
        """A new file of ours, mode 0600, in $PULSE_HOOK_DIR, the plugin's rules: the directory
        is not a symlink, is ours or root's and not writable by others unless sticky and ours;
        the file must not exist (O_EXCL) and is never reached through a symlink. A refusal
        switches recording off (reason in _out["refused"]); the job carries on."""
        try:
            dfd = os.open(os.environ["PULSE_HOOK_DIR"], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise _refuse("record directory missing or not a directory") from None
        try:
            st, me = os.fstat(dfd), os.geteuid()
            if st.st_uid not in (me, 0):
                raise _refuse("record directory owned by another user")
            if st.st_mode & 0o022 and not (st.st_mode & 0o1000 and st.st_uid == me):
                raise _refuse("record directory writable by others")
            try:
                return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC,
                               0o600, dir_fd=dfd)
            except FileExistsError:
                raise _refuse("record file already exists (not followed)") from None
        finally:
            os.close(dfd)

    def _write(event: dict, stream: str = "torch") -> None:
        line = (_encode(event) + "\n").encode()
        fd = _fds.get(stream, -1)
        if fd < 0:
            pid = os.getpid()
            fd = _create(f"{stream}-{_node}-{pid}.jsonl")
            _fds[stream] = fd
            if stream == "torch":
                _out["fd"], _out["pid"] = fd, pid
        os.write(fd, line)  # one write per line: O_APPEND keeps lines whole

    def _write_end(rec: tuple, end_ns: int) -> None:
        """An operator-level record (pulse.records.OpLevel): issue and completion on this rank."""
        comm_id, rank, seq, kind, nranks, start_ns = rec
        _write({"type": "oplevel", "v": 1, "job": _job, "node": _node, "comm_id": comm_id, "rank": rank,
                "seq": seq, "kind": kind, "nranks": nranks, "start_ns": start_ns, "end_ns": end_ns}, "oplevel")

    def _tensor(t) -> tuple[int, str, int]:
        """(count, dtype, bytes) of one tensor."""
        n = int(t.numel())
        name = str(t.dtype).rpartition(".")[2]
        dtype = _DTYPES.get(name)
        if dtype is None:  # bool, complex...: count bytes
            nbytes = n * int(t.element_size())
            return nbytes, "bytes", nbytes
        return n, dtype, n * _SIZES[dtype]

    def _sum(tensors) -> tuple[int, str, int]:
        parts = [_tensor(t) for t in tensors]
        if not parts:
            return 0, "bytes", 0
        dtypes = {p[1] for p in parts}
        nbytes = sum(p[2] for p in parts)
        if len(dtypes) == 1:
            return sum(p[0] for p in parts), dtypes.pop(), nbytes
        return nbytes, "bytes", nbytes

    def _group_info(dist, group) -> dict | None:
        g = group if group is not None else dist.group.WORLD
        if g is None:
            return None
        hit = _groups.get(id(g))
        if hit is not None and hit[0]() is g:
            return hit[1]
        rank = dist.get_rank(g)
        if rank < 0:  # not a member: torch returns without communicating
            return None
        ranks = [int(r) for r in dist.get_process_group_ranks(g)]
        name = ""
        try:
            name = str(dist.distributed_c10d._get_process_group_name(g))
        except Exception:
            name = str(getattr(g, "group_name", ""))
        digest = hashlib.sha1(f"{name}|{','.join(map(str, ranks))}".encode()).hexdigest()[:16]
        info = {"comm_id": f"torch:{digest}", "rank": int(rank), "nranks": len(ranks), "ranks": ranks, "seq": 0}
        ref: Callable[[], object]
        try:
            ref = weakref.ref(g)
        except TypeError:  # not weak-referenceable in some torch build: hold it
            ref = functools.partial(lambda obj: obj, g)
        if len(_groups) > 256:
            for k in [k for k, (r, _i) in _groups.items() if r() is None]:
                del _groups[k]
        _groups[id(g)] = (ref, info)
        _write({"type": "comm", "v": 1, "job": _job, "node": _node, "comm_id": info["comm_id"], "rank": info["rank"],
                "nranks": info["nranks"], "pid": os.getpid(), "t_host_ns": time.time_ns(), "source": "torch"})
        return info

    def _group_rank(info: dict, global_rank, group_rank=None):
        if group_rank is not None:
            return int(group_rank)
        if global_rank is None:
            return None
        try:
            return info["ranks"].index(int(global_rank))
        except ValueError:
            return None

    def _p2p_is_send(p2p_op) -> bool:
        name = getattr(p2p_op.op, "__name__", "")
        return "send" in name

    def _describe(dist, name: str, a: dict):
        """-> (group, fields) for the op event, or None to skip."""
        if name == "all_reduce":
            return a.get("group"), "AllReduce", _tensor(a["tensor"]), {}
        if name == "all_gather":
            info_t = _sum(a["tensor_list"])
            return a.get("group"), "AllGather", info_t, {}
        if name in ("all_gather_into_tensor", "all_gather_single"):
            return a.get("group"), "AllGather", _tensor(a["output_tensor"]), {}
        if name == "reduce_scatter":
            return a.get("group"), "ReduceScatter", _sum(a["input_list"]), {}
        if name in ("reduce_scatter_tensor", "reduce_scatter_single"):
            return a.get("group"), "ReduceScatter", _tensor(a["input"]), {}
        if name in ("broadcast", "reduce"):
            key = "src" if name == "broadcast" else "dst"
            return a.get("group"), name.capitalize(), _tensor(a["tensor"]), \
                {"root": (a.get(key), a.get("group_" + key))}
        if name in ("send", "isend"):
            return a.get("group"), "Send", _tensor(a["tensor"]), {"peer": (a.get("dst"), a.get("group_dst"))}
        if name in ("recv", "irecv"):
            return a.get("group"), "Recv", _tensor(a["tensor"]), {"peer": (a.get("src"), a.get("group_src"))}
        if name == "barrier":
            return a.get("group"), "AllReduce", (0, "bytes", 0), {"barrier": True}
        if name == "batch_isend_irecv":
            ops = list(a["p2p_op_list"])
            if not ops:
                return None
            items = [(_p2p_is_send(o), o.peer, getattr(o, "group_peer", None), _tensor(o.tensor)) for o in ops]
            return ops[0].group, "batch", None, {"items": items}
        if name == "all_to_all":
            sends = [_tensor(t) for t in a["input_tensor_list"]]
            recvs = [_tensor(t) for t in a["output_tensor_list"]]
            return a.get("group"), "all_to_all", None, {"sends": sends, "recvs": recvs}
        if name == "all_to_all_single":
            out_t, in_t = a["output"], a["input"]
            return a.get("group"), "all_to_all_single", None, {
                "in": (_tensor(in_t), int(in_t.shape[0]) if in_t.dim() else 1, a.get("input_split_sizes")),
                "out": (_tensor(out_t), int(out_t.shape[0]) if out_t.dim() else 1, a.get("output_split_sizes"))}
        return None

    def _split_bytes(spec, n: int) -> list[int]:
        (_count, _dtype, nbytes), rows, splits = spec
        row_bytes = nbytes // rows if rows else 0
        if splits is None:
            return [nbytes // n] * n
        return [int(s) * row_bytes for s in splits]

    def _record(name: str, a: dict):
        """Write the op (and comm) event of one call; -> (comm, rank, seq, kind, nranks, t_ns) or None."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return None
        desc = _describe(dist, name, a)
        if desc is None:
            return None
        group, kind, tensor, extra = desc
        with _lock:
            info = _group_info(dist, group)
            if info is None:
                return
            seq = info["seq"]
            info["seq"] += 1
            me = info["rank"]
            ev = {"type": "op", "v": 1, "job": _job, "node": _node, "comm_id": info["comm_id"], "rank": me,
                  "seq": seq, "nranks": info["nranks"]}
            if kind in ("batch", "all_to_all", "all_to_all_single"):
                n = info["nranks"]
                sent = [0] * n
                recv = [0] * n
                dtypes = set()
                if kind == "batch":
                    for is_send, peer, group_peer, (_c, dt, nb) in extra["items"]:
                        p = _group_rank(info, peer, group_peer)
                        if p is None:
                            return
                        (sent if is_send else recv)[p] += nb
                        dtypes.add(dt)
                    involved = sorted({_group_rank(info, pr, gp) for _s, pr, gp, _t in extra["items"]})
                elif kind == "all_to_all":
                    for p, (_c, dt, nb) in enumerate(extra["sends"][:n]):
                        sent[p] = nb
                        dtypes.add(dt)
                    for p, (_c, _dt, nb) in enumerate(extra["recvs"][:n]):
                        recv[p] = nb
                    involved = [p for p in range(n) if p != me]
                else:
                    sent = _split_bytes(extra["in"], n)
                    recv = _split_bytes(extra["out"], n)
                    dtypes.add(extra["in"][0][1])
                    involved = [p for p in range(n) if p != me]
                if kind == "batch" and len(extra["items"]) == 1:
                    is_send, peer, group_peer, (count, dtype, nbytes) = extra["items"][0]
                    ev.update(kind="Send" if is_send else "Recv", count=count, dtype=dtype, bytes=nbytes,
                              peer=involved[0])
                else:
                    total = sum(sent[p] for p in involved)
                    dtype = dtypes.pop() if len(dtypes) == 1 else "bytes"
                    ev.update(kind="GroupP2P", count=total // _SIZES[dtype], dtype=dtype, bytes=total, group=seq,
                              peers=involved, peer_send_bytes=[sent[p] for p in involved],
                              peer_recv_bytes=[recv[p] for p in involved])
            else:
                count, dtype, nbytes = tensor
                ev.update(kind=kind, count=count, dtype=dtype, bytes=nbytes)
                for field in ("root", "peer"):
                    if field in extra:
                        r = _group_rank(info, *extra[field])
                        if r is None:
                            return  # e.g. recv from any source: the peer is unknown
                        ev[field] = r
            ev["t_host_ns"] = time.time_ns()
            ev["source"] = "torch:barrier" if extra.get("barrier") else "torch"
            _write(ev)
            return (info["comm_id"], me, seq, ev["kind"], info["nranks"], ev["t_host_ns"])

    _ASYNC = ("isend", "irecv", "batch_isend_irecv")

    def _failed() -> None:
        _out["failures"] += 1
        if _out["failures"] >= _MAX_FAILURES:
            _out["disabled"] = True

    def _wrap(name: str, fn):
        import inspect

        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            return fn
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            return fn
        # A dict of arguments by name, without inspect's per-call cost: positional names in
        # order, then defaults for what the caller left out.
        names = tuple(p.name for p in params)
        defaults = {p.name: p.default for p in params if p.default is not p.empty}

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if _tls.busy or _out["disabled"]:
                return fn(*args, **kwargs)
            _tls.busy = True
            try:
                rec = None
                try:
                    bound = dict(defaults)
                    bound.update(zip(names, args, strict=False))  # extra positionals: torch raises
                    bound.update(kwargs)
                    rec = _record(name, bound)
                except Exception:
                    _failed()
                result = fn(*args, **kwargs)
                if rec is not None:
                    try:
                        if _tls.capture is not None:
                            _tls.capture.append(rec)  # a DDP comm hook's op: its future completes it
                        elif name not in _ASYNC and not bound.get("async_op"):
                            _write_end(rec, time.time_ns())  # a blocking call returned: it completed here
                    except Exception:
                        _failed()
                return result
            finally:
                _tls.busy = False

        wrapper.__pulse_wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    _NAMES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
              "reduce_scatter_tensor", "reduce_scatter_single",
              "broadcast", "reduce", "send", "recv", "isend", "irecv", "batch_isend_irecv", "all_to_all",
              "all_to_all_single", "barrier")

    def _patch(dist) -> None:
        c10d = getattr(dist, "distributed_c10d", None)
        for name in _NAMES:
            orig = getattr(c10d, name, None) or getattr(dist, name, None)
            if orig is None or hasattr(orig, "__pulse_wrapped__"):
                continue
            wrapped = _wrap(name, orig)
            for mod in (c10d, dist):
                if mod is not None and getattr(mod, name, None) is orig:
                    setattr(mod, name, wrapped)

    # -- DDP: the C++ reducer issues gradient AllReduces that no Python entry point sees --
    def _hook_done(ops: list, fut):
        """The hook's future completed: one oplevel record per operator it issued, then the
        hook's own result, unchanged (a failed collective raises here as it would have)."""
        try:
            end = time.time_ns()
            fut.value()  # raises if the collective failed: then it did not complete
            for rec in ops:
                _write_end(rec, end)
        except Exception:
            pass
        return fut.value()

    def _timed(hook):
        """Wrap a DDP comm hook: the collectives it issues go through the wrapped entry points
        (op events); its future's completion is their end (oplevel records)."""
        if getattr(hook, "__pulse_timed__", False):
            return hook

        @functools.wraps(hook)  # keeps __qualname__ (DDP logs it) and the signature DDP checks
        def timed(state, bucket):
            if _out["disabled"] or _tls.capture is not None:
                return hook(state, bucket)
            _tls.capture = ops = []
            try:
                fut = hook(state, bucket)
            finally:
                _tls.capture = None
            if ops:
                try:
                    # DDP waits on the future it is given: chained, the records are on disk
                    # before DDP uses the bucket, so a job that ends with os._exit (skipping
                    # the interpreter's teardown) has them all; a side branch could lag.
                    return fut.then(functools.partial(_hook_done, ops))
                except Exception:
                    _failed()
            return fut

        timed.__pulse_timed__ = True  # type: ignore[attr-defined]
        return timed

    def _patch_ddp(mod) -> None:
        ddp_cls = getattr(mod, "DistributedDataParallel", None)
        if ddp_cls is None or getattr(ddp_cls, "__pulse_patched__", False):
            return
        register = ddp_cls.register_comm_hook
        register_builtin = getattr(ddp_cls, "_register_builtin_comm_hook", None)
        forward = ddp_cls.forward

        @functools.wraps(register)
        def register_comm_hook(self, state, hook):
            try:
                wrapped = _timed(hook)
            except Exception:
                wrapped = hook
            return register(self, state, wrapped)

        def _builtin(self, comm_hook_type):
            self.__dict__["_pulse_builtin_hook"] = True  # the reducer takes one hook only
            return register_builtin(self, comm_hook_type)

        def _default_hook(self) -> None:
            """No hook registered by the job at its first forward: register the equivalent of
            DDP's default (divide the bucket by the group size, AllReduce-sum it; torch's
            default_hooks.allreduce_hook), so that its AllReduces become visible."""
            d = self.__dict__
            if d.get("_pulse_checked") or not self.require_backward_grad_sync:
                return  # under no_sync: decide at the first forward that synchronises
            d["_pulse_checked"] = True
            if (os.environ.get("PULSE_TORCH_DDP_HOOK", "1") == "0" or d.get("_pulse_builtin_hook")
                    or getattr(self, "_comm_hooks", None) or getattr(self, "_use_python_reducer", False)
                    or getattr(self, "mixed_precision", None)
                    or getattr(self, "_delay_all_reduce_all_params", False) or getattr(self, "reducer", None) is None):
                return
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            self.register_comm_hook(self.process_group, default_hooks.allreduce_hook)

        @functools.wraps(forward)
        def ddp_forward(self, *args, **kwargs):
            if "_pulse_checked" not in self.__dict__:
                try:
                    _default_hook(self)
                except Exception:
                    self.__dict__["_pulse_checked"] = True
                    _failed()
            return forward(self, *args, **kwargs)

        ddp_cls.register_comm_hook = register_comm_hook
        if register_builtin is not None:
            ddp_cls._register_builtin_comm_hook = _builtin
        ddp_cls.forward = ddp_forward
        ddp_cls.__pulse_patched__ = True

    _PATCHES = {"torch.distributed": lambda m: _patch(m), "torch.nn.parallel.distributed": _patch_ddp}

    class _Finder(importlib.abc.MetaPathFinder):
        """Patches torch.distributed (and DDP) right after the job imports them; never imports
        torch itself."""

        def find_spec(self, fullname, path, target=None):
            patch = _PATCHES.get(fullname)
            if patch is None:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
            loader = spec.loader
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            original = loader.exec_module

            def exec_module(module):
                original(module)
                _done.add(fullname)
                if _done >= set(_PATCHES):
                    try:
                        sys.meta_path.remove(self)
                    except ValueError:
                        pass
                try:
                    patch(module)
                except Exception:
                    if fullname == "torch.distributed":
                        _out["disabled"] = True

            try:
                loader.exec_module = exec_module  # this loader instance serves this module only
            except Exception:
                return spec
            return spec

    _done: set = set()
    for _name, _fn in _PATCHES.items():
        if _name in sys.modules:  # imported before us (unusual): patch now
            _done.add(_name)
            try:
                _fn(sys.modules[_name])
            except Exception:
                pass
    if _done < set(_PATCHES):
        sys.meta_path.insert(0, _Finder())
