"""The one place a ``DeviceMesh`` is built from parallel degrees.

    from convoy.plan.dims import ParallelDims
    from convoy.train.parallel.mesh import build_mesh
    pm = build_mesh(ParallelDims.parse("dp=2,tp=2", world_size=4))   # after init_process_group
    pm.tp, pm.dp, pm.pp          # the sub-meshes (None where the degree is 1)
    pm.dp_rank, pm.dp_size       # which data shard this process reads, and how many there are
    pm.cp, pm.cp_rank            # the context-parallel sub-mesh (a ring over the sequence) and this rank in it

Dimension order comes from ``ParallelDims.mesh_shape()`` (pp outermost, then dp_replicate, dp_shard, cp, tp
innermost so tensor-parallel ranks are neighbours). When dp is both replicated and sharded, a flattened ``"dp"``
dimension is added so that data loading sees one data-parallel group; with cp, ``"dp_shard_cp"`` (what FSDP
shards over: the cp ranks read the same samples but hold different shards) and ``"dp_cp"`` (what the loss is
averaged over) are flattened too, as torchtitan and Accelerate name them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from convoy.errors import StrategyError
from convoy.plan.dims import ParallelDims

__all__ = ["ParallelMesh", "build_mesh", "default_device_type"]


@dataclass(frozen=True)
class ParallelMesh:
    """A built mesh and the degrees it was built from."""

    dims: ParallelDims
    """The degrees; their product is the world size."""
    mesh: DeviceMesh
    """The whole mesh, with the named dimensions of ``dims.mesh_shape()``."""

    def _sub(self, name: str) -> DeviceMesh | None:
        names = self.mesh.mesh_dim_names or ()
        return self.mesh[name] if name in names else None

    @property
    def tp(self) -> DeviceMesh | None:
        """Tensor-parallel sub-mesh, or None when tp == 1."""
        return self._sub("tp") if self.dims.tp_enabled else None

    @property
    def pp(self) -> DeviceMesh | None:
        """Pipeline sub-mesh, or None when pp == 1."""
        return self._sub("pp") if self.dims.pp_enabled else None

    @property
    def cp(self) -> DeviceMesh | None:
        """Context-parallel sub-mesh (the ring each sequence is split over), or None when cp == 1."""
        return self._sub("cp") if self.dims.cp_enabled else None

    @property
    def dp_cp(self) -> DeviceMesh | None:
        """The ranks the loss and gradients are averaged over (dp x cp, flattened), or None when both are 1."""
        return self.mesh["dp_cp"] if self.dims.cp_enabled else self.dp

    @property
    def dp(self) -> DeviceMesh | None:
        """The whole data-parallel sub-mesh (replicas x shards, flattened), or None when dp == 1."""
        if not self.dims.dp_enabled:
            return None
        if self.dims.hsdp_enabled:
            return self.mesh["dp"]  # the flattened dimension build_mesh adds (not among mesh_dim_names)
        return self._sub("dp_shard") if self.dims.dp_shard_enabled else self._sub("dp_replicate")

    @property
    def dp_shard_mesh(self) -> DeviceMesh | None:
        """The mesh FSDP shards over: ("dp_replicate", "dp_shard") for HSDP, else the dp mesh; with cp, dp_shard x
        cp flattened in place of dp_shard (each cp rank holds its own shard of the weights)."""
        if self.dims.cp_enabled:
            if self.dims.dp_replicate_enabled:
                return self.mesh["dp_replicate", "dp_shard_cp" if self.dims.dp_shard_enabled else "cp"]
            return self.mesh["dp_shard_cp"] if self.dims.dp_shard_enabled else self.cp
        if self.dims.hsdp_enabled:
            return self.mesh["dp_replicate", "dp_shard"]
        return self.dp

    def _rank_in(self, sub: DeviceMesh | None) -> int:
        return 0 if sub is None else sub.get_local_rank()

    @property
    def dp_rank(self) -> int:
        return self._rank_in(self.dp)

    @property
    def dp_size(self) -> int:
        return self.dims.dp

    @property
    def cp_rank(self) -> int:
        return self._rank_in(self.cp)

    @property
    def tp_rank(self) -> int:
        return self._rank_in(self.tp)

    @property
    def pp_rank(self) -> int:
        return self._rank_in(self.pp)


def default_device_type() -> str:
    """"cuda" (or the current accelerator's type) when one is available, else "cpu"."""

    accel = getattr(torch, "accelerator", None)
    if accel is not None and accel.is_available():
        current = accel.current_accelerator()
        if current is not None:
            return current.type
    return "cpu"


def build_mesh(dims: ParallelDims, *, device_type: str | None = None) -> ParallelMesh:
    """Build the mesh for ``dims`` over the current process group (which must match its world size)."""

    if not dist.is_initialized():
        raise StrategyError("building a device mesh needs a process group; launch with 'convoy launch' "
                            "(or call torch.distributed.init_process_group first)")
    dims.check_world_size(dist.get_world_size())
    shape = dims.mesh_shape()
    mesh = init_device_mesh(device_type or default_device_type(), tuple(size for _, size in shape),
                            mesh_dim_names=tuple(name for name, _ in shape))
    if dims.hsdp_enabled:
        mesh["dp_replicate", "dp_shard"]._flatten("dp")  # private but the documented torchtitan idiom
    if dims.dp_shard_enabled and dims.tp_enabled:
        # a gradient norm partial over both (clip_grad_norm_) is then one all-reduce, not two in sequence; without
        # it DTensor warns on every rank "flatten mesh dimensions ["dp_shard", "tp"]" (tensor/_redistribute.py)
        mesh["dp_shard", "tp"]._flatten("dp_shard_tp")
    if dims.cp_enabled:  # Accelerate's names exist whatever the other degrees (a one-dimension flatten is an alias)
        present = mesh.mesh_dim_names or ()
        if dims.tp_enabled:  # as dp_shard_tp: the gradient norm is partial over the FSDP ranks and tp at once
            mesh[tuple(n for n in ("dp_shard", "cp", "tp") if n in present)]._flatten("dp_cp_tp")
        mesh[tuple(n for n in ("dp_shard", "cp") if n in present)]._flatten("dp_shard_cp")
        mesh[tuple(n for n in ("dp_replicate", "dp_shard", "cp") if n in present)]._flatten("dp_cp")
    return ParallelMesh(dims=dims, mesh=mesh)
