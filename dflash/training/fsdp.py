"""`trainer=fsdp`: Lightning's `FSDPStrategy` with one FSDP unit per drafter layer and one
full (unsharded) state dict per checkpoint, which also runs on the CPU over gloo.

On GPUs the strategy is Lightning's own. On the CPU Lightning cannot run FSDP, for three
reasons, each lifted here:

1. the Trainer refuses a CPU accelerator for `FSDPStrategy` by its exact type (Lightning
   issue #21812), which this subclass passes;
2. Lightning wraps the module with `device_id=root_device.index`, None for the CPU, which
   torch refuses: on the CPU the module is wrapped here with the device itself;
3. full state dicts gathered with `offload_to_cpu=True` on the CPU free a storage still in
   use, a SIGSEGV at the first checkpoint (Lightning issue #21804): on the CPU they are
   gathered without offload.
"""

from __future__ import annotations

from contextlib import contextmanager

from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import FSDPStrategy


class DrafterFSDPStrategy(FSDPStrategy):
    """`FSDPStrategy` that also runs with accelerator="cpu" (see the module docstring)."""

    def _on_cpu(self) -> bool:
        return self.root_device.type == "cpu"

    def _setup_model(self, model):
        from torch.distributed.fsdp import FullyShardedDataParallel

        if not self._on_cpu() or any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            return super()._setup_model(model)
        policy = self.kwargs.pop("auto_wrap_policy", None)
        try:
            wrapped = FullyShardedDataParallel(
                module=model,
                cpu_offload=self.cpu_offload,
                mixed_precision=self.mixed_precision_config,
                sharding_strategy=self.sharding_strategy,
                device_id=self.root_device,
                auto_wrap_policy=policy,
                **self.kwargs,
            )
            # Already wrapped: Lightning only moves the metrics and sets up activation
            # checkpointing (without the policy in kwargs it does not warn that it ignores it).
            return super()._setup_model(wrapped)
        finally:
            if policy is not None:
                self.kwargs["auto_wrap_policy"] = policy

    def lightning_module_state_dict(self) -> dict:
        if not self._on_cpu():
            return super().lightning_module_state_dict()
        with _full_state_dict_without_offload(self.model):
            return self.model.state_dict()

    def optimizer_state(self, optimizer) -> dict:
        if not self._on_cpu():
            return super().optimizer_state(optimizer)
        from torch.distributed.fsdp import FullyShardedDataParallel, OptimStateKeyType

        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        with _full_state_dict_without_offload(self.model):
            state = FullyShardedDataParallel.optim_state_dict(self.model, optimizer)
            if self.global_rank == 0:  # the standard format, as Lightning's own strategy stores it
                state = FullyShardedDataParallel.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
            return state


@contextmanager
def _full_state_dict_without_offload(module):
    """Lightning's full-state-dict context (gathered on rank 0) with offload_to_cpu=False."""
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType
    from torch.distributed.fsdp.api import FullOptimStateDictConfig

    with FullyShardedDataParallel.state_dict_type(
        module=module,
        state_dict_type=StateDictType.FULL_STATE_DICT,
        state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=True),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=True),
    ):
        yield
