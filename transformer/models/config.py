"""ModelConfig and ConfigError live in transformer/config.py (a module that imports nothing else of the
package); this name is kept so that existing `from transformer.models.config import ...` keep working."""
from transformer.config import (COMPUTE_DTYPES, FAMILIES, ConfigError, MissingInputError, ModelConfig,  # noqa: F401
                                model_defaults)
