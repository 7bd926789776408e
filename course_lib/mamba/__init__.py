"""Chapter 05: Mamba from scratch.

- `ssm`       the continuous SSM, ZOH and Euler discretization, recurrence vs convolution kernel
- `scan`      the selective scan: sequential, associative (log-depth) and chunked
- `model`     MambaConfig, MambaBlock, the Mamba LM (Hugging Face parameter names), MambaCache
- `generate`  sampling with a fixed-size recurrent state
- `tasks`     the selective-copying toy task (selective against time-invariant, in the lesson)
"""

from course_lib.mamba.model import Mamba, MambaBlock, MambaCache, MambaConfig, RMSNorm, causal_conv1d
from course_lib.mamba.scan import (
                                   associative_scan,
                                   combine,
                                   discretize,
                                   selective_scan_chunked,
                                   selective_scan_parallel,
                                   selective_scan_sequential,
)
