"""grad_health's findings in words: what to do about a non-finite value (or where to look
for it), a run that has stopped training (non-finite steps in a row), and the exit status
of a strict run that ended with a finding. Words and two small acts that every part
says the same way; no state."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from autograd_guard.guards.grad_health.voice import Voice

MAKE_SAFE = (
    "make that op safe for gradients (sqrt(x + eps), clamp its input, torch.where on a "
    "safe input) or lower the learning rate"
)
DETECT = "torch.autograd.detect_anomaly() (it raises at the op, at 2-3x the step's cost)"
FIND_IT = (
    "run with AUTOGRAD_GUARD=fix, which keeps the weights finite and names the backward op "
    f"and forward line if the value comes again, or wrap the failing step in {DETECT}"
)
ORIGIN_REMEDY = (
    "make that forward operation safe for gradients: add an epsilon (sqrt(x + eps)), "
    "clamp its input, or compute it with torch.where on a safe input"
)
MADE_REMEDY = (
    "keep that forward value finite even where the loss drops it: a fully masked softmax "
    "row needs a finite fill (or torch.where on the scores), log(x) a clamp(min=eps) or "
    "torch.where on a safe input, x / y a safe denominator"
)
LOSS_REMEDY = (
    "find the op that made the loss non-finite (a nonfinite_loss event names it where the "
    "loss is one value passed to backward()); keep the loss finite: a loss's own option "
    "for infeasible samples (CTC's zero_infinity=True), the bad sample dropped, a clamp on "
    "a log's input, a safe denominator"
)
STALL_REMEDY = (
    "stop the run and fix the op that makes the non-finite value, or resume from a "
    "checkpoint: a step with non-finite gradients does not train"
)
EXIT_STATUS = 3  # strict: a run that ended with a finding


def say_stall(voice: Voice, event: str, site: str, steps: int, remedy: str, note: str = "") -> None:
    """A ``training_stalled`` error: raised where ``on_stall = "raise"``, else logged
    (``note`` added to its remedy), whatever the mode."""
    if voice.config["on_stall"] == "raise":
        voice.refuse(event, action="training_stalled", callsite=site, remedy=remedy)
    voice.emit(
        event,
        action="training_stalled",
        callsite=site,
        level="error",
        remedy=remedy + note,
        steps=steps,
        always=True,
    )


def short(line: str, site: str) -> str:
    """``file:line`` as ``line N`` where the file is the call site's (said beside it)."""
    file, _, number = line.rpartition(":")
    return number if file and file == site.rpartition(":")[0] else line


def strict_finding() -> None:
    """strict: the process ends with a non-zero status, whatever else it did."""
    from autograd_guard._events import events as _events

    _events.fail_at_exit(EXIT_STATUS)
