// What the launcher that started this process says about the job, read from the variables each
// launcher sets: how many processes it started, this one's rank among those on its machine, and
// whether the ranks span machines. Open MPI's mpirun (OMPI_COMM_WORLD_*), then PMI (PMI_SIZE:
// MPICH's Hydra, srun --mpi=pmi2) with Hydra's MPI_LOCALRANKID and MPI_LOCALNRANKS, then Slurm's
// srun job step (SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_STEP_NUM_NODES, which srun --mpi=pmix
// leaves as the only ones). The first launcher that says a thing is believed: an mpirun or a
// Hydra inside a Slurm allocation sets its own beside Slurm's, which then describe the daemons'
// step, not the ranks. Only SLURM_STEP_* count, not the allocation's SLURM_NTASKS, which a
// batch script sees with no job step started.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <optional>

namespace train {

namespace detail {
/// The first of `names` that is set, as an integer.
inline std::optional<int> first_set(std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (const char* value = std::getenv(name)) return std::atoi(value);
  return std::nullopt;
}
}  // namespace detail

/// The processes a launcher started beside this one, itself included; 1 for a process started
/// alone.
inline int launched_processes() {
  return std::max(1, detail::first_set({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}).value_or(1));
}

/// This rank's rank among the processes of its machine, where the launcher says; else its rank
/// in the world (ranks as threads, or a launcher that does not tell).
inline int local_rank(int world_rank) {
  return detail::first_set({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}).value_or(world_rank);
}

/// Whether the `world` ranks run on more than one machine: fewer of them share this one than
/// the world holds (Open MPI's and Hydra's local counts), or Slurm's step spans several nodes.
/// Ranks as threads share one process.
inline bool ranks_span_machines(int world) {
  if (const auto local = detail::first_set({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})) return *local < world;
  if (const auto nodes = detail::first_set({"SLURM_STEP_NUM_NODES"})) return *nodes > 1;
  return false;
}

}  // namespace train
