"""moe-lab's Hydra launchers (`hydra/launcher=submitit_slurm | submitit_local`, configs/hydra/launcher/).

Hydra instantiates plugins only from the `hydra_plugins` namespace package, so the classes the
presets name live here; what they do is moe/cluster/launcher.py."""

from moe.cluster.launcher import SubmititSweepLauncher


class MoeSlurmLauncher(SubmititSweepLauncher):
    """Each job of the sweep is a SLURM job (the sweep one job array), started by sbatch + srun."""

    _EXECUTOR = "slurm"


class MoeLocalLauncher(SubmititSweepLauncher):
    """Each job of the sweep runs on this machine (submitit's LocalExecutor), all jobs at once."""

    _EXECUTOR = "local"
