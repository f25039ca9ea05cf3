"""Every private attribute of a dependency that this project still touches, in one place.

Each entry says why it exists and for which version it was written, and tests/test_compat.py exercises each one, so
an upgrade that breaks it fails in CI under the entry's own name instead of somewhere deep in a training run.
Checked on torch 2.13.0, torchrl 0.14.1, tensordict 0.14.3, ray 2.60.0, gymnasium 1.4.0.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

# --- tensordict ------------------------------------------------------------------------------------------------------


def fast_from_any() -> None:
    """tensordict 0.14.3 routes every tensor a TensorDictModule writes through ``TensorDict.from_any``, which falls
    through to ``importlib.util.find_spec("pandas")``: a sys.path search on every module call when pandas is absent,
    a visible share of a profiled DQN CartPole run. Plain tensors are returned as they are, which is what
    ``from_any`` ends up doing for them. Patches the public classmethod once (idempotent); applied where a process
    starts the off-policy engine's code (``offpolicy.prepare_process``), never on import."""
    from tensordict import TensorDictBase

    original = TensorDictBase.from_any.__func__
    if getattr(original, "rlstack_fast", False):
        return

    def from_any(cls, obj, *args, **kwargs):
        if type(obj) is torch.Tensor or type(obj) is torch.nn.Parameter:
            return obj
        return original(cls, obj, *args, **kwargs)

    from_any.rlstack_fast = True
    from_any.tensordict_original = original  # for the tests that start from tensordict's own, as a fresh process
    TensorDictBase.from_any = classmethod(from_any)


# --- torch: modules --------------------------------------------------------------------------------------------------


def has_forward_hooks(module: torch.nn.Module) -> bool:
    """Whether calling ``module`` would run forward (pre-)hooks: its own or a submodule's (torch 2.13 keeps them in
    the private ``_forward_hooks`` / ``_forward_pre_hooks`` dicts) or global ones (``register_module_forward_hook``,
    kept in ``torch.nn.modules.module._global_forward_hooks`` / ``_global_forward_pre_hooks``). No public accessor
    exists; :func:`shared.models.chained_forward` calls layers' forwards directly only where nothing would be
    skipped."""
    from torch.nn.modules import module as module_mod

    if module_mod._global_forward_hooks or module_mod._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


def cpu_computes_bf16_natively() -> bool:
    """Whether this CPU has bfloat16 instructions (AVX512-BF16 or AMX tiles), where oneDNN runs bf16 convolutions
    faster than float32 ones (the Nature-CNN DQN update: docs/results.md, "DQN on Atari (Pong)") instead of emulating
    them. torch 2.13 answers it
    only with the private ``torch.cpu._is_avx512_bf16_supported`` / ``_is_amx_tile_supported``."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


# --- torchrl / torch: compiling the learner step ---------------------------------------------------------------------


def pseudo_vmap_without_pytree_edits() -> None:
    """torchrl 0.14.1's ``objectives.utils._pseudo_vmap`` (how SACLoss and TD3Loss with ``deactivate_vmap=True``
    evaluate their Q networks) enters tensordict's ``_exclude_td_from_pytree`` on every call: it pops TensorDict from
    torch's pytree registry and puts it back, so the registry dict's version changes on every call, torch.compile's
    guard on it (``___dict_version(...SUPPORTED_NODES)``) fails, and a compiled step recompiles on every call (SAC:
    2.5 s a step). This is the same unbind / call / stack without editing the registry: ``tree_map`` over ``in_dims``
    flattens the arguments only up to in_dims' leaves, so a TensorDict argument stays whole without the exclusion
    (losses checked equal to torchrl's in tests/test_compat.py). Set before the losses are built (``_vmap_func`` looks
    the function up when a loss is constructed); idempotent."""
    import functools
    from copy import copy

    from torch.utils._pytree import tree_map
    from torchrl.objectives import utils

    if getattr(utils._pseudo_vmap, "rlstack_no_pytree_edits", False):
        return

    def pseudo_vmap(func, in_dims=0, out_dims=0, randomness=None, *, chunk_size=None):
        if randomness not in (None, "different", "error"):
            raise ValueError(f"pseudo_vmap supports the randomness modes 'different' and 'error', not {randomness!r}")

        def unbind(dim, x):
            return x.unbind(dim) if dim is not None and hasattr(x, "unbind") else (copy(x) for _ in range(1000))

        def stack(dim, x):
            return torch.stack(list(x), dim) if dim is not None else x

        @functools.wraps(func)
        def new_func(*args, **kwargs):
            dims_in = (in_dims,) * len(args) if isinstance(in_dims, int) else in_dims
            dims_out = (out_dims,) if isinstance(out_dims, int) else out_dims
            results = []
            for sliced in zip(*tree_map(unbind, dims_in, args)):
                r = func(*sliced, **kwargs)
                results.append(r if isinstance(r, tuple) else (r,))
            stacked = tuple(tree_map(stack, dims_out, tuple(zip(*results))))
            return stacked[0] if len(stacked) == 1 else stacked

        return new_func

    pseudo_vmap.rlstack_no_pytree_edits = True
    pseudo_vmap.torchrl_original = utils._pseudo_vmap  # for the test that compares the two
    utils._pseudo_vmap = pseudo_vmap


def compilations_of(fn) -> int:
    """How many times torch.compile has compiled ``fn``'s own frame so far: the number of dynamo cache entries on its
    code object (torch 2.13's ``torch._dynamo.eval_frame._debug_get_cache_entry_list``; no public API counts them,
    and the public-looking process-wide counter ``counters["stats"]["unique_graphs"]`` also moves with every other
    compiled function and with each graph break). A compilation adds one entry, whatever graph breaks split it into
    (their resume functions have code objects of their own); so one more after a warm-up is one recompilation of
    ``fn``. Up to dynamo's ``recompile_limit`` entries (8), after which it runs ``fn`` eagerly."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(fn.__code__))


def compile_mode_options(mode: str | None) -> dict:
    """The inductor options a ``torch.compile`` ``mode`` stands for (torch 2.13's ``torch._inductor.list_mode_options``,
    private package): torch.compile refuses a ``mode`` together with ``options``, so a compiled step that passes
    options of its own (the learner's guard filter) passes its mode as these options instead. ``None``: no options."""
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode)) if mode is not None else {}


# --- torchrl: TD3's actor loss ---------------------------------------------------------------------------------------


def td3_actor_loss_on_first_q(loss, tensordict):
    """torchrl 0.14.1's ``TD3Loss.actor_loss`` evaluating only the first Q network. torchrl's runs all
    ``num_qvalue_nets`` Q networks on the actor's actions, forward and backward, and keeps the first one's value
    (``-Q_1``, as the TD3 paper's actor loss): the others' work is thrown away (a Q forward and backward on every
    actor step). This is the same body with the first network's detached parameters; the private pieces it needs
    are the loss's detached-parameter cache ``_cached_detach_qvalue_network_params``, ``_maybe_get_priority_weight``,
    ``_reduce_loss`` and ``_clear_weakrefs`` (its compile-time cleanup). Returns ``(loss_actor, metadata)`` as
    torchrl's, with ``state_action_value_actor`` of the first network only."""
    weights = loss._maybe_get_priority_weight(tensordict)
    actor_td = tensordict.select(*loss.actor_network.in_keys, strict=False)
    with loss.actor_network_params.to_module(loss.actor_network, preserve_module_state=False):
        actor_td = loss.actor_network(actor_td)
    first_q = loss._cached_detach_qvalue_network_params[0]
    with first_q.to_module(loss.qvalue_network, preserve_module_state=False):
        value = loss.qvalue_network(actor_td.select(*loss.qvalue_network.in_keys, strict=False))
    value = value.get(loss.tensor_keys.state_action_value).squeeze(-1)
    loss_actor = loss._reduce_loss(-value, tensordict=tensordict, weights=weights)
    loss._clear_weakrefs(tensordict, "actor_network_params", "qvalue_network_params", "target_actor_network_params",
                         "target_qvalue_network_params")  # the same cleanup as torchrl's
    return loss_actor, {"state_action_value_actor": value.detach()}


# --- torchrl: replay -------------------------------------------------------------------------------------------------
# torchrl 0.14.1 keeps a storage's data under the state-dict key "_storage" and has no public way to reopen a
# LazyMemmapStorage's files: a memmap checkpoint keeps only the length, cursor and sampler state, and resume maps the
# files back in.
STORAGE_KEY = "_storage"


def replay_state_without_data(state: dict) -> dict:
    """A replay buffer's ``state_dict()`` without the storage's data (which stays in its memmap files)."""
    return {**state, STORAGE_KEY: {k: v for k, v in state[STORAGE_KEY].items() if k != STORAGE_KEY}}


def reopen_memmap_replay(replay, scratch_dir: Path, state: dict) -> None:
    """Map a memmap replay's files in ``scratch_dir`` back into ``replay`` and load the rest of ``state``."""
    from tensordict import TensorDict

    data = TensorDict.load_memmap(scratch_dir)
    replay.storage._storage = data  # load_state_dict below then copies in place, onto the same files
    replay.load_state_dict({**state, STORAGE_KEY: {**state[STORAGE_KEY], STORAGE_KEY: data.state_dict()}})


def replay_write_cursor(replay) -> int:
    """Where a torchrl 0.14.1 replay buffer's next write goes (its ``RoundRobinWriter``'s private ``_cursor``; the
    public ``state_dict()`` has it too, but also returns the storage's whole data): the memmap replay's undo journal
    saves the entries there before they are overwritten (offpolicy/replay/buffer.py)."""
    return int(replay._writer._cursor)


def replay_state_write_count(state: dict) -> int:
    """The write count in a torchrl 0.14.1 replay buffer's ``state_dict()`` (under the writer's ``_writer`` /
    ``_write_count`` keys): the memmap replay's journal undoes the writes made after it (offpolicy/replay/buffer.py)."""
    return int(state["_writer"]["_write_count"])


class PrioritizedTreesHook:
    """Mixin for torchrl 0.14.1's ``PrioritizedSampler`` / ``PrioritizedSliceSampler``: build the sum and min trees
    as ``tree_class(capacity, reduce, dtype)`` in the private ``_init`` where torchrl builds its C++ segment trees
    (whose extension does not load against torch 2.13 here), and checkpoint them as tensors (``values``, and
    ``set_all`` to load) so ``torch.load(weights_only=True)`` accepts the state."""

    TREES = ("_sum_tree", "_min_tree")
    tree_class: type  # set by the concrete sampler (offpolicy/replay/prioritized.py)

    def _init(self) -> None:
        self._sum_tree = self.tree_class(self._max_capacity, "sum", self.dtype)
        self._min_tree = self.tree_class(self._max_capacity, "min", self.dtype)

    def trees(self) -> tuple[Any, Any]:
        """The (sum, min) trees."""
        return self._sum_tree, self._min_tree

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        for key, tree in zip(self.TREES, self.trees()):
            state[key] = tree.values.clone()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        values = {k: state_dict[k] for k in self.TREES}
        super().load_state_dict({**state_dict, **{k: None for k in self.TREES}})
        self._init()
        for key, tree in zip(self.TREES, self.trees()):
            tree.set_all(values[key])


class SamplerOnTorchRNG:
    """Mixin for torchrl 0.14.1's ``PrioritizedSampler`` / ``PrioritizedSliceSampler``: draw from torch's default
    generator when the replay buffer was given none. torchrl's samplers read the private ``_rng`` (assigned by
    ``ReplayBuffer.set_rng``, None by default), and ``PrioritizedSampler.sample`` then draws its masses from numpy's
    global RNG, which nothing seeds or checkpoints: the same seed sampled other indices, and a resumed run sampled
    another stream. torch's default generator is seeded by the run's ``torch.manual_seed`` and saved with
    ``torch.get_rng_state()``. The masses are then float32 (torchrl's generator path): steps of 2^-24 of the total
    priority, as fine as torchrl's own float32 C++ trees."""

    _buffer_generator: torch.Generator | None = None

    @property
    def _rng(self) -> torch.Generator:
        return torch.default_generator if self._buffer_generator is None else self._buffer_generator

    @_rng.setter
    def _rng(self, generator: torch.Generator | None) -> None:
        self._buffer_generator = generator


# --- torchrl / gymnasium: rendering -----------------------------------------------------------------------------------


def gym_env_of(env):
    """The Gymnasium env inside a torchrl ``GymEnv`` (transformed or not): torchrl 0.14.1 keeps it as ``_env`` and
    offers no public accessor; rendering a frame for a video needs it."""
    return env.base_env._env if hasattr(env, "base_env") else env._env


def make_mujoco_context_current(gym_env) -> None:
    """Gymnasium 1.4's MuJoCo renderer keeps one GL context per render mode behind the private ``_get_viewer``; with
    several envs in one process, each must make its own context current before rendering."""
    gym_env.unwrapped.mujoco_renderer._get_viewer(gym_env.unwrapped.render_mode).make_context_current()


# --- ray --------------------------------------------------------------------------------------------------------------


def ray_single_machine_mode() -> None:
    """Make a local Ray cluster listen on 127.0.0.1 only. ``ray.init(_node_ip_address="127.0.0.1")`` does not: Ray 2.60
    swaps a loopback node address for the machine's routable one unless its single-machine switch
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read at import of ``ray._private.ray_constants``) is off. The variable is
    inherited by the raylet and every worker."""
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
