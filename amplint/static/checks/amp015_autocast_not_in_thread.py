"""AMP015 autocast-not-in-thread: work handed to another thread from inside an autocast region."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from amplint.static import names
from amplint.static.checks import Hit
from amplint.static.semantics import AmpFacts, CallSite, dotted_name, string_literal
from amplint.static.source import code_only

CODE = "AMP015"

_THREAD = {"threading.Thread", "threading.Timer"}
_EXECUTORS = {
    "concurrent.futures.ThreadPoolExecutor",
    "concurrent.futures.thread.ThreadPoolExecutor",
    "concurrent.futures.ProcessPoolExecutor",
    "multiprocessing.pool.ThreadPool",
    "multiprocessing.dummy.Pool",
}
_EXECUTOR_NAME = re.compile(r"executor|thread_?pool|^pool$|_pool$|^ex$|^tpe$")
_IO_WORK = re.compile(r"\bopen\(|\.write|json|print\(|logg|requests\.|upload|socket|\.send(?:all|to)?\(|\.recv|sleep\(|wandb|tensorboard|writer\.|queue|\.put\(|shutil|os\.")
_MODEL_WORK = re.compile(r"model|\bnet\b|forward|generate|\bF\.|\bnn\.|self\.\w+\(")
# A model's `encode(x)` / `decode(z)` takes what it encodes; `str.encode()` and
# `bytes.decode("utf-8")` take at most a codec's name and error policy.
_CODEC_METHODS = frozenset({"encode", "decode"})
_CODEC_KEYWORDS = frozenset({"encoding", "errors"})
_CODEC_NAME = re.compile(r"(?:en|de)code")
_CODEC_SPELLING = re.compile(r"[A-Za-z][\w.-]{0,19}")
# torch functions autocast leaves alone: they build, copy or move tensors (a prefetch thread's
# `torch.as_tensor(batch).pin_memory()`, `torch.clone(d).to(device)`), whatever thread runs them.
_MOVES_DATA = frozenset({
    "torch.as_tensor", "torch.from_numpy", "torch.tensor", "torch.clone", "torch.stack", "torch.cat",
    "torch.zeros", "torch.ones", "torch.empty", "torch.full", "torch.arange", "torch.zeros_like",
    "torch.ones_like", "torch.empty_like", "torch.full_like", "torch.linspace", "torch.eye",
    # a loader thread's synthetic or shuffled batch: random tensors are built, not cast
    "torch.rand", "torch.randn", "torch.randint", "torch.randperm", "torch.rand_like", "torch.randn_like",
    "torch.randint_like", "torch.Generator", "torch.manual_seed",
    "torch.load", "torch.save", "torch.no_grad", "torch.inference_mode",
    "torch.cuda.stream", "torch.cuda.Stream", "torch.cuda.current_stream", "torch.cuda.synchronize",
    "torch.cuda.set_device", "torch.set_num_threads",
})


def _bound_to(facts: AmpFacts, call: CallSite, qualnames: set[str]) -> bool:
    for value, scope in facts.bindings(call.receiver_key, call.scope):
        if isinstance(value, cst.Call) and facts.qualname(value.func, scope) in qualnames:
            return True
    # `with ThreadPoolExecutor() as pool:`
    for item in call.where.withs:
        if item.asname is not None and dotted_name(item.asname.name) == call.receiver_key:
            if isinstance(item.item, cst.Call) and facts.qualname(item.item.func, call.scope) in qualnames:
                return True
    return False


# Calls that are bookkeeping, not tensor work: logging, containers, queues, events, printing.
_HARMLESS_METHODS = frozenset({
    "append", "extend", "insert", "add", "update", "put", "put_nowait", "get", "get_nowait", "pop",
    "info", "debug", "warning", "warn", "error", "exception", "critical", "log", "write", "flush",
    "set", "clear", "wait", "is_set", "acquire", "release", "notify", "notify_all", "format", "items",
    "keys", "values", "join", "split", "strip", "rstrip", "lstrip", "splitlines", "read", "readline", "readlines",
    # moving data: autocast does not cast these
    "to", "cuda", "cpu", "pin_memory", "contiguous", "clone", "detach", "numpy", "tolist", "item", "record_stream",
    "manual_seed",  # `torch.Generator().manual_seed(i)`: a loader's reproducible batch
})
_HARMLESS_FUNCTIONS = frozenset({
    "print", "len", "range", "str", "repr", "int", "float", "bool", "min", "max", "sum", "sorted",
    "enumerate", "zip", "isinstance", "iter", "next", "time.sleep", "sleep", "time.time", "time.perf_counter",
})


def _target_does_no_tensor_work(facts: AmpFacts, target: cst.BaseExpression | None, call: CallSite) -> bool:
    """A same-file worker with no model or `F.` calls and no torch call but those that build or
    move tensors: it does input/output, moves data, or every call it makes is bookkeeping
    (`log.info(...)`, `results.append(i)`)."""
    if target is None:
        return False
    if facts.qualname(target, call.scope) in _MOVES_DATA:
        return True  # `Thread(target=torch.save, args=(state, path))`: a checkpoint written in the background
    function = facts._function_named(target, call.scope)
    if function is None:
        return _named_for_data_work(dotted_name(target)) or any(map(_named_for_data_work, _names_of_the_worker(facts, call)))
    text = code_only(facts.module.code_for_node(function.node))
    if _MODEL_WORK.search(text) or any(_torch_compute(c) or _model_codec(c) for c in function.calls):
        return False
    bookkeeping = all(
        c.qualname in _MOVES_DATA
        or ((c.method in _HARMLESS_METHODS or c.method in _CODEC_METHODS) if c.method is not None else (c.callee in _HARMLESS_FUNCTIONS))
        for c in function.calls
    )
    return bookkeeping or bool(_IO_WORK.search(text))


# Words of a worker's name that say it moves data (`env.prefetch`, `self.loader.start_prefetch`,
# `writer.flush_queue`); split on underscores and case changes, so `compute_logits` says nothing.
_DATA_WORK_WORDS = frozenset({
    "prefetch", "preload", "fetch", "load", "loader", "download", "upload", "save", "saver", "write", "writer",
    "dump", "log", "logger", "flush", "read", "reader", "produce", "producer", "feed", "fill", "enqueue",
    "queue", "poll", "monitor", "watch", "heartbeat", "copy", "transfer", "send", "recv", "receive", "checkpoint",
})
_NAME_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


def _named_for_data_work(name: str | None) -> bool:
    """A worker defined in another module, which this file cannot read, by what its name says:
    lerobot's `Thread(target=env.prefetch)` loads observations; `Thread(target=model.generate)`
    and `Thread(target=self.run)` say nothing of the sort."""
    if name is None:
        return False
    return any(word.lower() in _DATA_WORK_WORDS for word in _NAME_WORDS.findall(name.rsplit(".", 1)[-1]))


def _names_of_the_worker(facts: AmpFacts, call: CallSite) -> Iterator[str]:
    """What the file calls the thread it starts: its `name=` and the name it is assigned to
    (lerobot's `prefetch_thread = threading.Thread(target=next_env._ensure)`)."""
    name = string_literal(call.arg(None, "name")) if call.qualname in _THREAD else None
    if name is not None:
        yield name
    yield from (a.key for a in facts.assignments if a.value is call.node)


def _model_codec(call: CallSite) -> bool:
    """A model's `encode`/`decode` (`vae.decode(z)`, CLIP's `encode_image(x)`), not a text
    codec's: `str.encode()`, `raw.decode(encoding, errors="replace")`."""
    if not call.method or not _CODEC_NAME.match(call.method):
        return False
    if call.method not in _CODEC_METHODS:
        return True  # `encode_image`, `decode_latents`
    arguments = call.node.args
    if any(arg.keyword is not None and arg.keyword.value == "errors" for arg in arguments):
        return False
    return any(
        arg.star or (arg.keyword.value not in _CODEC_KEYWORDS if arg.keyword else not _names_a_codec(arg.value))
        for arg in arguments
    )


def _names_a_codec(value: cst.BaseExpression) -> bool:
    """`"utf-8"`, `"ascii"`: a codec's name, not text to embed (`retriever.encode(f"query: {q}")`)."""
    return isinstance(value, cst.SimpleString) and isinstance(value.evaluated_value, str) and bool(
        _CODEC_SPELLING.fullmatch(value.evaluated_value)
    )


def _torch_compute(call: CallSite) -> bool:
    return call.qualname is not None and call.qualname.startswith("torch") and call.qualname not in _MOVES_DATA


def _target_enters_autocast(facts: AmpFacts, target: cst.BaseExpression | None, call: CallSite) -> bool:
    """A worker that opens its own autocast region gets the autocast state it needs."""
    function = facts._function_named(target, call.scope) if target is not None else None
    if function is None:
        return False
    if any(facts.decorator_autocast(d, function.parent or function) for d in function.decorators):
        return True
    return any(c.qualname in names.AUTOCAST for c in facts.calls if c.scope.function_scope is function)


def _started_work(facts: AmpFacts, call: CallSite) -> tuple[str, cst.BaseExpression | None] | None:
    if call.qualname in _THREAD:
        return "a `threading.Thread`", call.arg(None, "target") or call.arg(1, None)
    if call.method in ("submit", "map") and call.receiver_key:
        if _bound_to(facts, call, _EXECUTORS) or _EXECUTOR_NAME.search(call.receiver_key.split(".")[-1].lower()):
            return f"`{call.receiver_key}.{call.method}()`", call.arg(0, "fn")
    if call.method in ("apply_async", "map_async", "imap", "starmap") and call.receiver_key and _bound_to(facts, call, _EXECUTORS):
        return f"`{call.receiver_key}.{call.method}()`", call.arg(0, None)
    return None


def check(facts: AmpFacts) -> Iterator[Hit]:
    if not facts.has_autocast:
        return
    for call in facts.calls:
        started = _started_work(facts, call)
        if started is None:
            continue
        what, target = started
        region = facts.region_of(call.where)
        if region is None or _target_does_no_tensor_work(facts, target, call) or _target_enters_autocast(facts, target, call):
            continue
        autocast, via = region
        yield Hit(
            call.node,
            f"{what} starts work inside the autocast region on line {{0}}, but autocast state is "
            f"thread-local: the worker runs in float32 (or under its own autocast state); enter "
            f"`torch.autocast(...)` inside the worker function",
            call.where.statement,
            related=(autocast.node,),
        )
