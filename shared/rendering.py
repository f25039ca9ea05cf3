"""Offscreen rendering of MuJoCo envs on this CPU: EGL when there is no display, cheap render settings, one GL context
per env made current around its render, and RGB frames for videos."""
from __future__ import annotations

import contextlib
import functools
import os

import numpy as np

from shared import compat


def headless_gl() -> None:
    """Render MuJoCo offscreen through EGL when no backend is chosen and there is no display (set before the first
    MuJoCo/dm_control render context is made)."""
    if "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
        os.environ["MUJOCO_GL"] = "egl"


def fast_render(model) -> None:
    """Cheap offscreen rendering for a MuJoCo model (``mujoco.MjModel`` or dm_control's wrapper): no shadows, no
    reflections, no multisampling. On a CPU renderer (llvmpipe) that makes a small frame about ten times cheaper, and
    the bodies stay clearly visible. Call it before the first render (multisampling is fixed when the GL context is made).
    Physics is unchanged."""
    model.light_castshadow[:] = 0
    model.mat_reflectance[:] = 0
    model.vis.quality.offsamples = 0


@functools.lru_cache(maxsize=1)
def current_gl_context_wrapper() -> type:
    import gymnasium

    class CurrentGLContext(gymnasium.Wrapper):
        """Render with this MuJoCo env's own OpenGL context current, then give the thread back its previous one.

        Gymnasium's renderer assumes its context stays current, so with two rendering envs in one process
        (``SerialEnv`` copies, train + eval envs) all but the last one made render black frames; dm_control, which
        remembers which of its contexts is current, drew untextured frames after a Gymnasium render.
        """

        def render(self):
            with _keep_current_egl_context():
                compat.make_mujoco_context_current(self.env)
                return self.env.render()

    return CurrentGLContext


@contextlib.contextmanager
def _keep_current_egl_context():
    """Make the thread's current EGL context current again on exit (a no-op for other OpenGL backends)."""
    if os.environ.get("MUJOCO_GL") != "egl":
        yield
        return
    from mujoco.egl import egl_ext as EGL

    previous = (EGL.eglGetCurrentDisplay(), EGL.eglGetCurrentSurface(EGL.EGL_DRAW),
                EGL.eglGetCurrentSurface(EGL.EGL_READ), EGL.eglGetCurrentContext())
    try:
        yield
    finally:
        if previous[-1]:
            EGL.eglMakeCurrent(*previous)


def render_frame(env) -> np.ndarray:
    """An RGB frame ``[H, W, 3]`` uint8 (a copy) of a single env made by :func:`make_env` with ``render=True``."""
    return np.array(compat.gym_env_of(env).render(), copy=True)  # rendered frames have negative strides
