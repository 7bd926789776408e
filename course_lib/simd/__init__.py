"""Chapter 10's building blocks for compiled loops that keep the CPU's vector units busy.

- `fastexp`  exp(z) for z <= 0 from multiplies, adds and bit operations, so that a loop of them vectorizes
- `tiles`    small matrix products (a @ b.T) whose sums stay in registers, and a tile transpose

The lesson builds a sibling of each (sections 3 and 6), and the exercises import them: they are tools,
no exercise's answer. Numba inlines them into the kernels that call them.
"""
