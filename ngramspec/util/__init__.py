"""Layer 0, util: helpers that know nothing of drafting or models.

Owns crash-safe files, output locks, record logs and the cache folder (``files``), and the
import of optional dependencies with an error naming their extra (``extras``).

May import: the standard library only. Every other layer may import it.
"""
