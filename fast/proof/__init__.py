"""proof: the tools that show fast/'s kernels right (the gate, the planted bugs, the PTX
walks, same_kernels.py), run as modules from fast/: `python -m proof.planted_bugs`.

REPOSITORY is the lesson's folder, which holds fast/: the tree that the tools copy,
compile and read their sources from.
"""

import os

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
