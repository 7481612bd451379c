"""AMP001 deprecated-amp-api: the device-specific `torch.cuda.amp` / `torch.cpu.amp` API."""

from __future__ import annotations

from collections.abc import Iterator

from amplint.static import autofix, names
from amplint.static.checks import Hit
from amplint.static.semantics import AmpFacts

CODE = "AMP001"

_REPLACEMENT = {
    "autocast": 'torch.amp.autocast("{device}", ...) with keyword arguments',
    "GradScaler": 'torch.amp.GradScaler("{device}", ...)',
    "custom_fwd": 'torch.amp.custom_fwd(device_type="{device}", ...)',
    "custom_bwd": 'torch.amp.custom_bwd(device_type="{device}")',
}


def message_for(qualname: str) -> str:
    if qualname in names.DEPRECATED_AUTOCAST_STATE:
        return f"`{qualname}()` is deprecated since torch 2.4; use `{names.DEPRECATED_AUTOCAST_STATE[qualname]}`"
    device, kind = names.DEPRECATED_AMP[qualname]
    replacement = _REPLACEMENT[kind].format(device=device)
    return f"`torch.{device}.amp.{kind}` is deprecated since torch 2.4; use `{replacement}`"


def _is_deprecated(qualname: str | None) -> bool:
    return qualname in names.DEPRECATED_AMP or qualname in names.DEPRECATED_AUTOCAST_STATE


def check(facts: AmpFacts) -> Iterator[Hit]:
    for ref in facts.imports:
        if _is_deprecated(ref.qualname):
            yield Hit(ref.node, message_for(ref.qualname), ref.statement, autofix.deprecated_import(ref, facts))
    for call in facts.calls:
        if _is_deprecated(call.qualname) and facts.qualname(call.node.func, call.scope) == call.qualname:
            yield Hit(call.node.func, message_for(call.qualname), call.where.statement, autofix.deprecated_call(call, facts))
    for ref in facts.references:
        qualname = ref.where.scope.resolve(ref.dotted)
        if _is_deprecated(qualname):
            yield Hit(ref.node, message_for(qualname), ref.where.statement, autofix.deprecated_reference(ref, qualname, facts))
