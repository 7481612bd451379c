"""`--save-baseline` / `--baseline`: keep the FP32 reference and compare against it later.

The guide's rollback (SEED.md §6): keep the reference and the case that justified a rollback, and
after a fix re-run the comparison on the same dataset. A stored baseline is only a reference for the
same experiment, so the file records what identifies it - the case ids, a hash of the weights, a
hash of the inputs, the device - and loading it against a spec that differs in any of them is an
error. Decisions, margins and quality are recomputed from the stored outputs with the spec's current
functions, so both sides are always judged by the same rules.
"""

from __future__ import annotations

import datetime
import os
import sys

import torch

from amplint.compare import outputs as out
from amplint.compare.errors import CompareError, describe_exception
from amplint.compare.run import Baseline, Prepared
from amplint.compare.spec_modules import module_name as spec_module_name

FORMAT = "amplint-compare-baseline"
VERSION = 1


def save_baseline(path: str, prepared: Prepared, baseline: Baseline) -> None:
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "spec": os.path.basename(prepared.spec.path),
        "device": prepared.spec.device,
        "torch": str(torch.__version__),  # TorchVersion would not load with weights_only
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "weights_sha256": prepared.weights_sha256,
        "inputs_sha256": prepared.inputs_sha256,
        "case_ids": [case_id for case_id, _ in prepared.cases],
        "criteria": prepared.spec.criteria.to_json(),
        "outputs": [out.storable(output) for output in baseline.outputs],
    }
    try:
        torch.save(payload, path)
    except (OSError, RuntimeError) as exc:
        raise CompareError(f"cannot write the baseline to {path}: {describe_exception(exc)}") from None


def _first_ids(ids: list) -> str:
    """The first five case ids, and how many more there are."""
    shown = ", ".join(map(repr, ids[:5]))
    return shown + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def load_baseline(path: str, prepared: Prepared) -> Baseline:
    if os.path.isdir(path):
        raise CompareError(f"baseline file {path} is a directory")
    if not os.path.isfile(path):
        raise CompareError(f"baseline file {path}: no such file")
    try:
        # weights_only: a baseline file holds tensors and plain containers, never code to run.
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise CompareError(f"baseline file {path} cannot be read: {describe_exception(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - torch.load raises anything from KeyError to RuntimeError on a foreign file
        if isinstance(exc, RuntimeError) and "PytorchStreamReader" in str(exc):
            # A torch zip archive cut short or damaged: perhaps a real baseline, so say what broke.
            raise CompareError(f"baseline file {path} cannot be read (truncated or damaged): {describe_exception(exc)}") from None
        # A JSON report, a text file, or a file torch.save wrote with objects in it: torch's message
        # ("KeyError: 105", or a suggestion of weights_only=False) says nothing useful here.
        raise CompareError(f"baseline file {path} is not an amplint compare baseline (written by --save-baseline)") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CompareError(f"baseline file {path} is not an amplint compare baseline (written by --save-baseline)")
    if payload.get("version") != VERSION:
        raise CompareError(f"baseline file {path} has format version {payload.get('version')}, this amplint reads {VERSION}")

    ids = [case_id for case_id, _ in prepared.cases]
    stored_ids = list(payload["case_ids"])
    if stored_ids != ids:
        missing = [case_id for case_id in stored_ids if case_id not in ids]
        added = [case_id for case_id in ids if case_id not in stored_ids]
        if missing or added:
            detail = "; ".join(
                part
                for part in (
                    f"missing from the spec: {_first_ids(missing)}" if missing else "",
                    f"new in the spec: {_first_ids(added)}" if added else "",
                )
                if part
            )
        else:
            detail = "the same ids in a different order"
        raise CompareError(f"baseline file {path} was saved for other cases ({detail})")
    if payload["weights_sha256"] != prepared.weights_sha256:
        raise CompareError(
            f"baseline file {path} was saved for other model weights "
            f"(sha256 {payload['weights_sha256'][:12]}…, the spec's model gives {prepared.weights_sha256[:12]}…)"
        )
    if payload["inputs_sha256"] != prepared.inputs_sha256:
        raise CompareError(
            f"baseline file {path} was saved for other case inputs with the same ids "
            f"(sha256 {payload['inputs_sha256'][:12]}…, the spec's cases give {prepared.inputs_sha256[:12]}…)"
        )
    if payload["device"] != prepared.spec.device:
        # Results are not guaranteed identical across devices: the gap would not be precision's.
        raise CompareError(
            f"baseline file {path} was recorded on {payload['device']!r}, the spec runs on {prepared.spec.device!r}; "
            "record a baseline on the device you compare on"
        )
    if len(payload["outputs"]) != len(ids):
        raise CompareError(f"baseline file {path} is damaged: {len(payload['outputs'])} outputs for {len(ids)} cases")
    return Baseline(
        outputs=[out.restore(output, sys.modules.get(spec_module_name(prepared.spec.path))) for output in payload["outputs"]],
        source=path,
        criteria_at_save=payload.get("criteria"),
        torch_at_save=payload.get("torch"),
    )
