"""Chapter 05: Mamba from scratch.

- `ssm`       the continuous SSM, ZOH and Euler discretization, recurrence vs convolution kernel
- `scan`      the selective scan: sequential, associative (log-depth) and chunked
- `model`     MambaConfig, MambaBlock, the Mamba LM (Hugging Face parameter names), MambaCache
- `generate`  sampling with a fixed-size recurrent state
- `tasks`     the selective-copying toy task (selective against time-invariant, in the lesson)

ssm, scan and model hold the course's answers to chapter 05's exercises, each marked with the
exercise it answers: read them once your checks pass. The names below are the chapter's library, to
use before then.
"""

from course_lib.mamba.generate import generate
from course_lib.mamba.model import Mamba, MambaBlock, MambaCache, MambaConfig, RMSNorm, causal_conv1d
from course_lib.mamba.scan import (
                                   SCANS,
                                   associative_scan,
                                   combine,
                                   discretize,
                                   readout,
                                   selective_scan_chunked,
                                   selective_scan_parallel,
                                   selective_scan_sequential,
)
from course_lib.mamba.ssm import discretize_euler, discretize_zoh, ssm_convolve, ssm_kernel, ssm_recurrent
from course_lib.mamba.tasks import selective_copy_batch
