"""Run like Unique3D's gradio_app.py: grad is switched off in __main__, then a
reconstruction stage is called directly on the main thread.

    python unique3d_app.py                     # RuntimeError: ... does not require grad
    AUTOGRAD_GUARD=1 python unique3d_app.py    # guarded: works, and logs what it did
"""

import torch
from mesh_reconstruction.recon import reconstruct_stage1

if __name__ == "__main__":
    torch.set_grad_enabled(False)  # as Unique3D's entry scripts do
    target = torch.randn(642, 3)
    verts = reconstruct_stage1(target)
    print(f"stage 1 done: mean vertex error {float((verts - target).abs().mean()):.4f}")
