# polyshard-train under mpirun: started as two processes without --backend, it trains as one world
# of two MPI ranks (the backend follows the launcher), and its losses are those of two ranks as
# threads of one process, digit for digit (both communicators add in rank order). Ranks as threads
# in each of mpirun's processes, or a --world-size other than mpirun's, are refused.
# MPIRUN: the launcher and its flags, separated by '|'.
string(REPLACE "|" ";" mpirun "${MPIRUN}")
set(run --layers 1 --embd 32 --heads 2 --seq 16 --batch 4 --steps 3 --log-every 100 --strategy zero2)
include(${CMAKE_CURRENT_LIST_DIR}/train_losses.cmake)  # train, count_trace_events

# train() runs ${PROGRAM} ${common}: under mpirun first, then alone.
set(common ${run})
set(program ${PROGRAM})
set(PROGRAM ${mpirun} ${NP_FLAG} 2 ${program})
train(mpi)
set(PROGRAM ${program})
if(NOT mpi_out MATCHES "2 rank\\(s\\)")
  message(FATAL_ERROR "mpirun -np 2 polyshard-train (no --backend) did not train 2 ranks:\n${mpi_out}")
endif()
train(threads --world-size 2)
list(LENGTH mpi steps)
if(NOT steps EQUAL 3 OR NOT "${mpi}" STREQUAL "${threads}")
  message(FATAL_ERROR "losses under mpirun (${mpi}) differ from 2 ranks as threads (${threads})")
endif()

# Lightning's ddp_sharded batches small parameters in FairScale's 2^23-element buffers only when the
# ranks span machines: two processes told by Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE that each is
# alone on its machine reduce as sharded_ddp does, and fewer times than on one machine (each
# parameter alone). Counted as the reductions in rank 0's trace.
function(reductions out)
  file(REMOVE ${WORK_DIR}/reductions.json.rank0.json)
  execute_process(COMMAND ${mpirun} ${NP_FLAG} 2 ${ARGN} --trace ${WORK_DIR}/reductions.json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE printed ERROR_VARIABLE printed)
  if(NOT rc EQUAL 0 OR NOT EXISTS ${WORK_DIR}/reductions.json.rank0.json)
    string(JOIN " " command ${ARGN})
    message(FATAL_ERROR "mpirun -np 2 ${command} exited ${rc}:\n${printed}")
  endif()
  count_trace_events(${WORK_DIR}/reductions.json.rank0.json reduce n)
  set(${out} ${n} PARENT_SCOPE)
endfunction()
list(TRANSFORM run REPLACE "^zero2$" "ddp_sharded" OUTPUT_VARIABLE lightning_run)
reductions(one_machine ${PROGRAM} ${lightning_run})
reductions(two_machines ${CMAKE_COMMAND} -E env OMPI_COMM_WORLD_LOCAL_SIZE=1 ${PROGRAM} ${lightning_run})
list(TRANSFORM run REPLACE "^zero2$" "sharded_ddp" OUTPUT_VARIABLE fairscale_run)
reductions(fairscale ${PROGRAM} ${fairscale_run})
if(NOT (two_machines GREATER 0 AND two_machines EQUAL fairscale AND one_machine GREATER two_machines))
  message(FATAL_ERROR "ddp_sharded reduced ${one_machine} times on one machine and ${two_machines} across two; "
                      "sharded_ddp ${fairscale}")
endif()
# The same told by the other launchers' variables, Open MPI's own taken away: MPICH's Hydra
# (MPI_LOCALNRANKS, the processes on this machine) and Slurm's srun (SLURM_STEP_NUM_NODES).
set(without_open_mpi ${CMAKE_COMMAND} -E env --unset=OMPI_COMM_WORLD_LOCAL_SIZE)
reductions(hydra_two ${without_open_mpi} MPI_LOCALNRANKS=1 ${PROGRAM} ${lightning_run})
reductions(slurm_two ${without_open_mpi} SLURM_STEP_NUM_NODES=2 ${PROGRAM} ${lightning_run})
reductions(slurm_one ${without_open_mpi} SLURM_STEP_NUM_NODES=1 ${PROGRAM} ${lightning_run})
if(NOT (hydra_two EQUAL two_machines AND slurm_two EQUAL two_machines AND slurm_one EQUAL one_machine))
  message(FATAL_ERROR "ddp_sharded reduced ${hydra_two} times told by Hydra of two machines, ${slurm_two} by Slurm, "
                      "${slurm_one} by Slurm of one; Open MPI's: ${two_machines} and ${one_machine}")
endif()

# expect_refusal(text... ARGS arg...): the command fails (exit 2 from each process) printing every text.
function(expect_refusal)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "" "SAYS;ARGS")
  execute_process(COMMAND ${arg_ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  foreach(text IN LISTS arg_SAYS)
    string(FIND "${out}" "${text}" at)
    if(rc EQUAL 0 OR at EQUAL -1)
      string(JOIN " " command ${arg_ARGS})
      message(FATAL_ERROR "${command} exited ${rc} without '${text}':\n${out}")
    endif()
  endforeach()
endfunction()
expect_refusal(ARGS ${mpirun} ${NP_FLAG} 2 ${PROGRAM} ${run} --backend threads
               SAYS "--backend threads, and the launcher (mpirun, srun) started 2 processes: each would train alone")
expect_refusal(ARGS ${mpirun} ${NP_FLAG} 2 ${PROGRAM} ${run} --world-size 3
               SAYS "--world-size 3, and under --backend mpi the world is the 2 process(es)")
message(STATUS "mpirun -np 2: one world of 2 MPI ranks, losses equal to 2 ranks as threads; ddp_sharded's "
               "buffers as Lightning sets them on one machine and across two; threads and a --world-size other than "
               "-np refused")
