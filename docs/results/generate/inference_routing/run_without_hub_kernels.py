"""Run a module with transformers' hub-kernels integration off: a `kernels` pip package installed on
this shared machine at 16:02 makes transformers import this repository's own `kernels/` package."""
import runpy, sys
import transformers.utils.import_utils as u
u.is_kernels_available = lambda *a, **k: False
import transformers.utils as tu
tu.is_kernels_available = u.is_kernels_available
mod = sys.argv[1]
sys.argv = [mod] + sys.argv[2:]
runpy.run_module(mod, run_name="__main__", alter_sys=True)
