"""`amplint trace`: run a training script under instrumentation and prove (or refute) what the
static checker reported, with evidence from the real run.

Layout (each module is usable and testable on its own):
  options    what the user asked for (no torch)
  command    the click command; parses, validates, calls `session.run_trace`
  launcher   runs SCRIPT / -m MODULE as __main__ with its own argv, keeps its exit status;
             ends it in Python's order; tells the session when the script has imported torch
  callsite   which frame is "user code"; display paths
  state      everything the run records, in plain Python structures
  probes     API patches: autocast mirror, backward, GradScaler, optimizers, clipping,
             schedulers, module conversions, warnings (cheap, always on)
  recorder   the dispatch mode: per-op dtypes after autocast's casts, op-level NaN checks
  nonfinite  cheap / module / op localisation of the first inf/NaN
  policy     the documented autocast op policy per device, and departures from it
  confirm    joins static findings with the runtime facts
  kernels    replays recorded op signatures in another dtype/device
  simulate   CUDA autocast policy on fake CUDA tensors (no GPU needed)
  report     the JSON contract, per-rank files and the merged summary
  terminal   the rich summary; html: the self-contained page
"""
