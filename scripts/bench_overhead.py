"""Per-call cost of each guard's wrapper on its pass-through path, and of snapshot rules.

Each guard's real wrapper is put around a no-op with the target's signature, so that
the figure is the guard's own cost and not the library's noise: bare and wrapped calls
alternate in blocks, and the table holds the median per-call time of each.

    python scripts/bench_overhead.py [--calls 20000 --blocks 15]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from benchtable import Row, print_table

from autograd_guard._compile import dynamo_frames as _dynamo_frames
from autograd_guard._events import events as _events
from autograd_guard._policy import policy as _policy
from autograd_guard._runtime.guard import Guard, Target
from autograd_guard._runtime.proxies import guarded_function
from autograd_guard.guards import available


def guard_for(name: str, policy: dict[str, Any] | None = None) -> Guard:
    classes = {g.name: g for g in available()}
    return classes[name](_policy.load(policy or {}, list(classes.values()), environ={}))


def own_target(guard: Guard, module: str, qualname: str) -> Target:
    """The guard's own target (with the check and handler it names), as the engine wraps it."""
    for target in guard.targets_to_wrap():
        if (target.module, target.qualname) == (module, qualname):
            return target
    raise LookupError(f"{guard.name} does not wrap {module}:{qualname}")


def per_call(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        function(*args, **kwargs)
    return (time.perf_counter() - start) / calls * 1e6


def compare(
    bare: Any, wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any], calls: int, blocks: int
) -> tuple[float, float]:
    base, guarded = [], []
    for block in range(blocks):  # alternate which goes first
        order = ((bare, base), (wrapped, guarded))
        for function, samples in order if block % 2 else order[::-1]:
            samples.append(per_call(function, args, kwargs, calls))
    return statistics.median(base), statistics.median(guarded)


def wrap(guard: Guard, target: Target, function: Any) -> Any:
    # The proxy type the engine installs (it pickles, copies and compiles like the original).
    return guarded_function(function, guard.wrapper_for(target))


def measure(calls: int = 20000, blocks: int = 15) -> list[Row]:
    rows = []
    goal = "<= +1.5 us"

    def add(
        case: str,
        guard: Guard,
        target: Target,
        function: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None = None,
        row_goal: str = goal,
        n: int = calls,
    ) -> None:
        base, guarded = compare(
            function, wrap(guard, target, function), args, kwargs or {}, n, blocks
        )
        rows.append(Row("per call", case, base, guarded, "us", row_goal))

    tensor = torch.ones(4)

    def stage(x: Any) -> Any:
        return x

    add("grad_mode stage, grad on", guard_for("grad_mode"), Target("m", "stage"), stage, (tensor,))

    def add_method(case: str) -> None:
        """``obj.stage(x)``: the bound method a guarded method makes, then its call."""

        class Model:
            def stage(self, x: Any) -> Any:
                return x

        class Guarded:
            pass

        wrapper = guard_for("grad_mode").wrapper_for(Target("m", "Model.stage"))
        Guarded.stage = guarded_function(vars(Model)["stage"], wrapper, method=True)  # type: ignore[attr-defined]
        bare, guarded = Model(), Guarded()
        base, wrapped = compare(
            lambda x: bare.stage(x), lambda x: guarded.stage(x), (tensor,), {}, calls, blocks
        )
        rows.append(Row("per call", case, base, wrapped, "us", goal))

    add_method("grad_mode method obj.stage(x), grad on")

    class FakeMeshes:  # what taubin_smoothing reads of a Meshes on its pass-through path
        def verts_packed(self) -> Any:
            return tensor

    def taubin_smoothing(
        meshes: Any, lambd: float = 0.53, mu: float = -0.53, num_iter: int = 10
    ) -> Any:
        return meshes

    add(
        "pytorch3d_taubin, no grad, float32",
        guard_for("pytorch3d_taubin"),
        Target("pytorch3d.ops.mesh_filtering", "taubin_smoothing"),
        taubin_smoothing,
        (FakeMeshes(),),
    )

    def mesh_face_areas_normals(verts: Any, faces: Any) -> Any:
        return verts, faces

    faces = torch.zeros(4, 3, dtype=torch.int64)
    add(
        "pytorch3d_face_normals, vertices without grad",
        guard_for("pytorch3d_face_normals"),
        Target("pytorch3d.ops.mesh_face_areas_normals", "mesh_face_areas_normals"),
        mesh_face_areas_normals,
        (torch.ones(4, 3), faces),
    )
    rows += face_normals_grad_rows(calls, blocks)
    rows += pytorch3d_rows(add, calls, blocks, goal)

    def launch(
        kernel: Any,
        dim: Any,
        inputs: Any = (),
        outputs: Any = (),
        adj_inputs: Any = (),
        adj_outputs: Any = (),
        device: Any = None,
        stream: Any = None,
        adjoint: bool = False,
        record_tape: bool = True,
        record_cmd: bool = False,
        max_blocks: int = 0,
        block_dim: int = 256,
    ) -> None:
        return None

    warp = guard_for("warp_torch_args")
    runtime = types.SimpleNamespace(tape=None)
    warp._context = types.SimpleNamespace(runtime=runtime)  # type: ignore[assignment]
    arrays = [object(), object()]
    add(
        "warp_torch_args launch, no tape",
        warp,
        own_target(warp, "warp.context", "launch"),
        launch,
        ("kernel", 10),
        {"inputs": arrays[:1], "outputs": arrays[1:], "device": "cpu"},
    )
    runtime.tape = object()
    add(
        "warp_torch_args launch, tape, Warp arrays",
        warp,
        own_target(warp, "warp.context", "launch"),
        launch,
        ("kernel", 10),
        {"inputs": arrays[:1], "outputs": arrays[1:], "device": "cpu"},
    )

    def rasterization(*args: Any, **kwargs: Any) -> Any:
        return tensor, tensor, {"means2d": tensor}

    with torch.no_grad():
        add(
            "gsplat_means2d rasterization, no grad",
            guard_for("gsplat_means2d"),
            Target("gsplat.rendering", "rasterization"),
            rasterization,
            (tensor,),
        )
    add(
        "gsplat_means2d rasterization, grad on",
        guard_for("gsplat_means2d"),
        Target("gsplat.rendering", "rasterization"),
        rasterization,
        (tensor,),
    )

    def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        return input

    def interpolate(
        input: Any,
        size: Any = None,
        scale_factor: Any = None,
        mode: str = "nearest",
        align_corners: Any = None,
    ) -> Any:
        return input

    ipex = guard_for("ipex_xpu")
    with torch.no_grad():
        add(
            "ipex_xpu dropout, CPU tensor",
            ipex,
            own_target(ipex, "torch.nn.functional", "dropout"),
            dropout,
            (tensor, 0.1, True),
        )
    add(
        "ipex_xpu interpolate, bilinear",
        ipex,
        own_target(ipex, "torch.nn.functional", "interpolate"),
        interpolate,
        (tensor,),
        {"scale_factor": 2.0, "mode": "bilinear"},
    )

    def eight(a: Any, b: Any, c: Any, d: Any, e: Any, f: Any, g: Any, h: Any) -> Any:
        return a

    def one(x: Any) -> Any:
        return x

    def snapshot(check: str, target: str) -> tuple[Guard, Target]:
        guard = guard_for(
            "snapshot_inputs",
            {
                "rules": [
                    {
                        "target": f"bench:{target}",
                        "action": "snapshot",
                        "check": check,
                        "max_bytes": 2**30,
                    }
                ]
            },
        )
        return guard, next(iter(guard._rules))  # type: ignore[attr-defined]

    guard, target = snapshot("version", "eight")
    add(
        "snapshot rule, version, 8 tensor arguments",
        guard,
        target,
        eight,
        tuple(torch.ones(4) for _ in range(8)),
        row_goal="<= 2 us",
    )
    for label, numel, n in (("1 MB", 2**18, 500), ("100 MB", 25 * 2**20, 5)):
        guard, target = snapshot("data", "one")
        base, guarded = compare(
            one, wrap(guard, target, one), (torch.ones(numel),), {}, n, max(3, blocks // 3)
        )
        rows.append(
            Row(
                "per call",
                f"snapshot rule, data, one {label} tensor",
                base,
                guarded,
                "us",
                "copy + compare",
            )
        )
    # Last: a program that compiles has torch._dynamo imported, and each guarded call then
    # asks whether a compiled region runs it (see autograd_guard._compile.dynamo_frames).
    _dynamo_frames.dynamo_imported(importlib.import_module("torch._dynamo"))
    add(
        "grad_mode stage, grad on, torch._dynamo imported",
        guard_for("grad_mode"),
        Target("m", "stage"),
        stage,
        (tensor,),
    )
    add_method("grad_mode method obj.stage(x), grad on, torch._dynamo imported")
    return rows


def face_normals_grad_rows(calls: int, blocks: int) -> list[Row]:
    """pytorch3d_face_normals where the vertices need a gradient: fix mode runs the wrapped
    function (the library; the plain torch maths stands in for its kernel here) for the
    areas and the plain torch maths again for the normals, so the difference is that
    second run (the remedy) and the guard's own cost (its wrapper, the call site, the hook
    on the normals; in backward, the hook's one read of the normals' gradient)."""
    from autograd_guard.guards.pytorch3d_face_normals import face_areas_normals

    guard = guard_for("pytorch3d_face_normals")
    wrapped = wrap(
        guard,
        Target("pytorch3d.ops.mesh_face_areas_normals", "mesh_face_areas_normals"),
        face_areas_normals,
    )
    verts = torch.rand(12, 3, requires_grad=True)
    faces = torch.randint(0, 12, (20, 3))
    args = (verts, faces)
    n = max(calls // 10, 100)
    base, guarded = compare(face_areas_normals, wrapped, args, {}, n, blocks)
    rows = [Row("per call", "pytorch3d_face_normals, grad, 20 faces: forward", base, guarded, "us")]

    def backward_of(function: Any) -> Any:
        def step(verts: Any, faces: Any) -> None:
            areas, normals = function(verts, faces)
            (areas.sum() + normals.sum()).backward()

        return step

    _events.mute()  # its one event, at the first backward
    try:
        base, guarded = compare(
            backward_of(face_areas_normals), backward_of(wrapped), args, {}, n, blocks
        )
    finally:
        _events.mute(False)
    case = "pytorch3d_face_normals, grad, 20 faces: forward + backward through the normals"
    rows.append(Row("per call", case, base, guarded, "us"))
    return rows


def pytorch3d_rows(add: Any, calls: int, blocks: int, goal: str) -> list[Row]:
    """The PyTorch3D guards added with the real compiled extension in mind: each on the
    path correct code takes (PyTorch3D itself is not needed: no-ops with its signatures)."""

    def matrix_to_euler_angles(matrix: Any, convention: str) -> Any:
        # the library's middle angle (asin, or acos where the outer axes repeat), with its
        # non-finite derivative at +-1, so the guard's probe finds the bug as with torch <= 2.13
        entry = matrix[..., "XYZ".index(convention[0]), "XYZ".index(convention[2])]
        middle = torch.acos(entry) if convention[0] == convention[2] else torch.asin(entry)
        return torch.stack((entry, middle, entry), -1)

    euler = guard_for("pytorch3d_euler_gimbal")
    target = own_target(
        euler, "pytorch3d.transforms.rotation_conversions", "matrix_to_euler_angles"
    )
    rotations = torch.eye(3).repeat(64, 1, 1) * 0.5  # away from the lock
    add(
        "pytorch3d_euler_gimbal, no grad", euler, target, matrix_to_euler_angles, (rotations, "XYZ")
    )
    add(
        "pytorch3d_euler_gimbal, 64 rotations requiring grad, away from the lock (1 sync)",
        euler,
        target,
        matrix_to_euler_angles,
        (rotations.clone().requires_grad_(), "XYZ"),
        row_goal="<= 20 us",
    )

    def rasterize_points(pointclouds: Any, image_size: Any = 256, radius: Any = 0.01) -> Any:
        return pointclouds

    radius = guard_for("pytorch3d_point_radius")
    target = own_target(radius, "pytorch3d.renderer.points.rasterize_points", "rasterize_points")
    add("pytorch3d_point_radius, float radius", radius, target, rasterize_points, (None, 64, 0.01))
    add(
        "pytorch3d_point_radius, radius tensor without grad",
        radius,
        target,
        rasterize_points,
        (None, 64, torch.full((1, 100), 0.01)),
    )

    def rasterize_meshes(*args: Any) -> Any:
        return args[0]

    bins = guard_for("pytorch3d_bin_overflow")
    target = own_target(bins, "pytorch3d._C", "rasterize_meshes")
    face_verts = torch.ones(8, 3, 3)
    for case, bin_size in (("naive (bin_size=0)", 0), ("binned on the CPU", 8)):
        args = (face_verts, 0, 8, -1, (64, 64), 0.0, 8, bin_size, 10000, False, False, False)
        add(f"pytorch3d_bin_overflow, {case}", bins, target, rasterize_meshes, args)
    return silhouette_rows(calls, blocks, goal)


def silhouette_rows(calls: int, blocks: int, goal: str) -> list[Row]:
    """``renderer(meshes)`` through a guarded ``MeshRenderer.forward`` (a method), with a
    stand-in for PyTorch3D's shader module: a Phong shader, then a silhouette shader with
    the tutorials' blur (both correct code: no event), then a hard silhouette
    (``blur_radius=0``) whose 1x128x128x4 image requires grad: the guard hooks the image,
    and in backward reads its alpha channel's gradient (its event muted)."""
    shaders = types.ModuleType("pytorch3d.renderer.mesh.shader")

    class SoftSilhouetteShader:
        blend_params = types.SimpleNamespace(sigma=1e-4)

    class SoftPhongShader:
        pass

    shaders.SoftSilhouetteShader = SoftSilhouetteShader  # type: ignore[attr-defined]
    saved = sys.modules.get(shaders.__name__)
    sys.modules[shaders.__name__] = shaders
    image = torch.rand(1, 128, 128, 4, requires_grad=True)
    rows = []
    _events.mute()  # the hard silhouette's one event, at the first backward
    try:
        guard = guard_for("pytorch3d_hard_silhouette")
        wrapper = guard.wrapper_for(
            own_target(guard, "pytorch3d.renderer.mesh.renderer", "MeshRenderer.forward")
        )
        for case, shader, blur, args, backward in (
            ("Phong shader", SoftPhongShader(), 9.2e-4, (None,), False),
            ("silhouette, blur > 0", SoftSilhouetteShader(), 9.2e-4, (None,), False),
            (
                "silhouette, blur = 0, image requires grad: forward",
                SoftSilhouetteShader(),
                0.0,
                (image,),
                False,
            ),
            (
                "silhouette, blur = 0: forward + backward",
                SoftSilhouetteShader(),
                0.0,
                (image,),
                True,
            ),
        ):
            bare, guarded = renderer_pair(wrapper, shader, blur)
            functions = (bare.forward, guarded.forward)
            if backward:
                functions = tuple(map(backward_of_alpha, functions))
            n = calls if args == (None,) else max(calls // 20, 100)
            base, wrapped = compare(*functions, args, {}, n, blocks)
            name = f"pytorch3d_hard_silhouette renderer, {case}"
            rows.append(Row("per call", name, base, wrapped, "us", goal if n == calls else ""))
    finally:
        _events.mute(False)
        if saved is None:
            del sys.modules[shaders.__name__]
        else:
            sys.modules[shaders.__name__] = saved
    return rows


def renderer_pair(wrapper: Any, shader: Any, blur: float) -> tuple[Any, Any]:
    """A stand-in ``MeshRenderer`` (its forward: the image times one, a new tensor as the
    shader's output is), bare and with the guard's wrapper on ``forward``."""

    class Renderer:
        rasterizer = types.SimpleNamespace(
            raster_settings=types.SimpleNamespace(blur_radius=blur, faces_per_pixel=1)
        )

        def forward(self, meshes_world: Any, **kwargs: Any) -> Any:
            return meshes_world if meshes_world is None else meshes_world * 1.0

    class Guarded(Renderer):
        pass

    Guarded.forward = guarded_function(vars(Renderer)["forward"], wrapper, method=True)  # type: ignore[method-assign]
    bare, guarded = Renderer(), Guarded()
    bare.shader = guarded.shader = shader  # type: ignore[attr-defined]
    return bare, guarded


def backward_of_alpha(render: Any) -> Any:
    def step(image: Any) -> None:
        render(image)[..., 3].sum().backward()

    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--blocks", type=int, default=15)
    args = parser.parse_args()
    print_table(
        measure(args.calls, args.blocks),
        "per-call overhead: each guard's wrapper around a no-op, pass-through path",
    )


if __name__ == "__main__":
    main()
