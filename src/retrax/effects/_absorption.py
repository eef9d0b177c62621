r"""Delay-line networks with a one-pole lowpass in every loop, on `fdn`.

The network of [`FDNReverb`][retrax.effects.FDNReverb] and the combs of
[`Freeverb`][retrax.effects.Freeverb]: $N$ delay lines of $m_j \ge 2$
samples, each followed by a one-pole filter $f_j[t] = p_j f_j[t-1] + k_j
s_j[t - m_j]$ (DC gain $k_j / (1 - p_j)$), and
$s_i[t] = b_i x[t] + \sum_j A_{ij} f_j[t]$.

It is exactly a feedback delay network ([`retrax.ops.fdn`][]) of $2N$
lines: line $j$ of $m_j - 1$ samples holds $s_j$, and line $N + j$ of one
sample holds $q_j[t] = f_j[t + 1] / \alpha_j$, so that

$$s_i[t] = b_i x[t] + \sum_j A_{ij} \alpha_j\, q_j[t-1], \qquad
  q_j[t] = \frac{k_j}{\alpha_j}\, s_j[t - m_j + 1] + p_j\, q_j[t-1],$$

the loop of line $j$ still $m_j$ samples long. The scale $\alpha_j =
\sqrt{k_j}$ makes the $2N \times 2N$ feedback matrix
$\begin{pmatrix} 0 & A\alpha \\ \sqrt{k} & p \end{pmatrix}$ a contraction
whenever $A$ is orthogonal, $0 \le p_j < 1$ and the DC loop gain
$g_j = k_j / (1 - p_j) \le 1$: per line, its Gram matrix is
$\begin{pmatrix} k & p\sqrt k \\ p \sqrt k & k + p^2\end{pmatrix}$, of
determinant $k^2$ and trace $2k + p^2$, whose largest eigenvalue is at most
1 exactly when $p \le 1 - k$, i.e. $(1-p)(1-g) \ge 0$. So the op's
spectral-norm check holds, and the gradient is the op's adjoint recursion.
"""

import jax.numpy as jnp
from jax import Array

from ..ops import fdn


def absorbed_state_shape(delays: tuple[int, ...]) -> tuple[int, int]:
    """The shape of the network's state: `(2N, max(m) - 1)`."""
    return (2 * len(delays), max(max(delays) - 1, 1))


def absorbed_fdn(
    x: Array,
    delays: tuple[int, ...],
    A: Array,
    b: Array,
    c_lines: Array,
    c_filters: Array,
    k: Array,
    p: Array,
    zi: Array,
) -> tuple[Array, Array]:
    r"""The network above on `x` `(T,)` from the state `zi`; returns `(y, zf)`
    with $y[t] = \sum_j c^{\mathrm{lines}}_j s_j[t - m_j + 1] +
    c^{\mathrm{filters}}_j f_j[t]$."""
    n = len(delays)
    alpha = jnp.sqrt(k)
    M = jnp.concatenate(
        [
            jnp.concatenate([jnp.zeros((n, n), A.dtype), A * alpha], axis=1),
            jnp.concatenate([jnp.diag(alpha), jnp.diag(p)], axis=1),
        ]
    )
    lengths = tuple(m - 1 for m in delays) + (1,) * n
    b_all = jnp.concatenate([b, jnp.zeros(n, b.dtype)])
    c_all = jnp.concatenate([c_lines, c_filters * alpha])
    return fdn(x, lengths, M, b_all, c_all, zi=zi, return_zf=True)
