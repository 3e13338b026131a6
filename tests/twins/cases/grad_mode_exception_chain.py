"""A guarded stage raises a chained exception that ends the program: the same type, the
same cause and context, the same exit status."""

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:load_mesh"
        action = "enable_grad"
        [[rules]]
        target = "case:prepare"
        action = "snapshot"
    """,
    "modes": ["fix", "observe", "strict"],
}


class MeshError(ValueError):
    pass


def load_mesh(path):
    try:
        return {"verts": torch.load(path)}
    except FileNotFoundError as missing:
        raise MeshError(f"no mesh at {path}") from missing


def prepare(verts):
    try:
        return verts / verts.norm()
    except AttributeError:
        raise KeyError("verts") from None


def main():
    try:
        prepare(None)
    except KeyError as exc:
        print("caught", type(exc).__name__, exc.__cause__, exc.__suppress_context__)
    try:
        load_mesh("missing.pt")
    except MeshError as exc:
        try:
            raise RuntimeError("pipeline stopped")
        except RuntimeError:
            print("context", type(exc.__context__).__name__)
            raise
