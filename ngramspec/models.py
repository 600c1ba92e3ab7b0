"""``ngramspec.models``, kept as a path: the module :mod:`ngramspec.hf.models` itself (model
loading, the default model's GGUF and converted folder), for scripts and users that import it
from here (``from ngramspec.models import default_model_dir``)."""

import sys

from .hf import models

sys.modules[__name__] = models
