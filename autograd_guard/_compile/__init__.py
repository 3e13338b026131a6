"""``torch.compile`` support: guarded calls inside compiled regions (``compiled``), the checks
that run while Dynamo traces (``checks``), the guard's frames kept out of Dynamo
(``dynamo_frames``, ``resumable``) and inference-mode clones. Below the runtime: it sees a guard
only through the protocols of ``_common.protocols``."""
