# Checkpoints through polyshard-train: a run saved at step 3 and resumed to step 6 logs the same
# losses, digit for digit, as 6 uninterrupted steps (ZeRO-3 on 2 ranks, fp32), also when saved by
# ZeRO-Infinity; resumed instead as DDP on 1 rank it follows within rounding; full weights
# exported by one run start another.
set(common --layers 2 --heads 2 --embd 32 --seq 32 --batch 8 --log-every 100)
include(${CMAKE_CURRENT_LIST_DIR}/train_losses.cmake)

file(REMOVE_RECURSE ${WORK_DIR}/resume-ckpt)
train(whole --strategy zero3 --world-size 2 --steps 6)
train(first --strategy zero3 --world-size 2 --steps 3 --save ${WORK_DIR}/resume-ckpt --save-every 2)
if(NOT EXISTS ${WORK_DIR}/resume-ckpt/metadata.json OR NOT EXISTS ${WORK_DIR}/resume-ckpt/rank-00001-of-00002.safetensors)
  message(FATAL_ERROR "--save wrote no sharded checkpoint:\n${first_out}")
endif()
train(second --strategy zero3 --world-size 2 --steps 6 --resume ${WORK_DIR}/resume-ckpt)
list(SUBLIST whole 3 3 expected)
if(NOT second STREQUAL expected)
  message(FATAL_ERROR "resumed losses ${second} differ from the uninterrupted run's ${expected}")
endif()

# ZeRO-Infinity (optimizer state in files under --nvme-path) is ZeRO-3 bit for bit, and its
# checkpoints (state read from the files while saving) resume on ZeRO-3 exactly.
file(REMOVE_RECURSE ${WORK_DIR}/resume-nvme ${WORK_DIR}/resume-infinity-ckpt)
file(MAKE_DIRECTORY ${WORK_DIR}/resume-nvme)
train(infinity --strategy zero_infinity --world-size 2 --steps 6 --nvme-path ${WORK_DIR}/resume-nvme)
if(NOT infinity STREQUAL whole)
  message(FATAL_ERROR "zero_infinity losses ${infinity} differ from zero3's ${whole}")
endif()
train(infinity_first --strategy zero_infinity --world-size 2 --steps 3 --nvme-path ${WORK_DIR}/resume-nvme
      --save ${WORK_DIR}/resume-infinity-ckpt)
train(infinity_second --strategy zero3 --world-size 2 --steps 6 --resume ${WORK_DIR}/resume-infinity-ckpt)
if(NOT infinity_second STREQUAL expected)
  message(FATAL_ERROR "zero3 resumed from a zero_infinity checkpoint: ${infinity_second}, expected ${expected}")
endif()

# With the parameter shards in the files too (every one: --max-in-cpu 0), the same: ZeRO-3 bit for
# bit, and a checkpoint (shards, masters and state read from the files) that ZeRO-3 resumes exactly.
file(REMOVE_RECURSE ${WORK_DIR}/resume-nvme-parameters-ckpt)
set(parameters_on_nvme --strategy zero_infinity_parameters --nvme-path ${WORK_DIR}/resume-nvme --max-in-cpu 0)
train(parameters --world-size 2 --steps 6 ${parameters_on_nvme})
if(NOT parameters STREQUAL whole)
  message(FATAL_ERROR "zero_infinity_parameters losses ${parameters} differ from zero3's ${whole}")
endif()
train(parameters_first --world-size 2 --steps 3 ${parameters_on_nvme} --save ${WORK_DIR}/resume-nvme-parameters-ckpt)
train(parameters_second --strategy zero3 --world-size 2 --steps 6 --resume ${WORK_DIR}/resume-nvme-parameters-ckpt)
if(NOT parameters_second STREQUAL expected)
  message(FATAL_ERROR "zero3 resumed from a zero_infinity_parameters checkpoint: ${parameters_second}, "
                      "expected ${expected}")
endif()
# And the other way: a ZeRO-3 checkpoint loaded into the files resumes as ZeRO-3 would.
train(parameters_resumed --world-size 2 --steps 6 ${parameters_on_nvme} --resume ${WORK_DIR}/resume-ckpt)
if(NOT parameters_resumed STREQUAL expected)
  message(FATAL_ERROR "zero_infinity_parameters resumed from a zero3 checkpoint: ${parameters_resumed}, "
                      "expected ${expected}")
endif()

# Mixed precision, where ZeRO-Infinity keeps the fp32 masters in the files with the moments: its
# checkpoint (masters read from the files) resumes on ZeRO-3 exactly, and a ZeRO-3 checkpoint
# loaded into the files (masters written there, the bf16 shards refreshed from them) resumes as
# ZeRO-3 would.
file(REMOVE_RECURSE ${WORK_DIR}/resume-bf16-ckpt ${WORK_DIR}/resume-infinity-bf16-ckpt)
set(bf16 --precision bf16-mixed --world-size 2)
set(bf16_infinity --strategy zero_infinity --nvme-path ${WORK_DIR}/resume-nvme ${bf16})
train(bf16_whole --strategy zero3 --steps 6 ${bf16})
train(bf16_first --strategy zero3 --steps 3 ${bf16} --save ${WORK_DIR}/resume-bf16-ckpt)
list(SUBLIST bf16_whole 3 3 bf16_expected)
train(bf16_on_nvme --steps 6 ${bf16_infinity})
if(NOT bf16_on_nvme STREQUAL bf16_whole)
  message(FATAL_ERROR "zero_infinity bf16 losses ${bf16_on_nvme} differ from zero3's ${bf16_whole}")
endif()
train(bf16_on_nvme_first --steps 3 ${bf16_infinity} --save ${WORK_DIR}/resume-infinity-bf16-ckpt)
train(bf16_on_nvme_second --strategy zero3 --steps 6 ${bf16} --resume ${WORK_DIR}/resume-infinity-bf16-ckpt)
if(NOT bf16_on_nvme_second STREQUAL bf16_expected)
  message(FATAL_ERROR "zero3 bf16 resumed from a zero_infinity checkpoint: ${bf16_on_nvme_second}, "
                      "expected ${bf16_expected}")
endif()
train(bf16_on_nvme_resumed --steps 6 ${bf16_infinity} --resume ${WORK_DIR}/resume-bf16-ckpt)
if(NOT bf16_on_nvme_resumed STREQUAL bf16_expected)
  message(FATAL_ERROR "zero_infinity bf16 resumed from a zero3 checkpoint: ${bf16_on_nvme_resumed}, "
                      "expected ${bf16_expected}")
endif()

# Another strategy and world size: the same data, losses within rounding (to 1e-4).
train(ddp --strategy ddp --world-size 1 --steps 6 --resume ${WORK_DIR}/resume-ckpt)
foreach(i RANGE 2)
  list(GET ddp ${i} got)
  list(GET expected ${i} want)
  string(REGEX REPLACE "^[0-9]+:" "" got "${got}")
  string(REGEX REPLACE "^[0-9]+:" "" want "${want}")
  foreach(pair "got" "want")
    string(REGEX MATCH "^([0-9]+)\\.([0-9]*)" _ "${${pair}}")
    set(integer_part "${CMAKE_MATCH_1}")
    set(fraction "${CMAKE_MATCH_2}000000")
    string(SUBSTRING "${fraction}" 0 6 fraction)
    string(REGEX REPLACE "^0+([0-9])" "\\1" fraction "${fraction}")
    math(EXPR ${pair}_micro "${integer_part} * 1000000 + ${fraction}")
  endforeach()
  math(EXPR difference "${got_micro} - ${want_micro}")
  if(difference LESS -100 OR difference GREATER 100)
    message(FATAL_ERROR "ddp x1 resumed from zero3 x2: losses ${ddp}, expected ${expected}")
  endif()
endforeach()

# Full weights: --export then --init starts where the first run ended.
train(exported --strategy zero2 --world-size 2 --steps 3 --export ${WORK_DIR}/resume-weights.safetensors)
train(started --strategy fsdp --world-size 1 --steps 1 --lr 1e-12 --init ${WORK_DIR}/resume-weights.safetensors)
train(fresh --strategy fsdp --world-size 1 --steps 1 --lr 1e-12)
if(started STREQUAL fresh)
  message(FATAL_ERROR "--init changed nothing: ${started}")
endif()
message(STATUS "resumed ${second} = ${expected}; ddp x1 ${ddp}; init ${started} vs fresh ${fresh}")
