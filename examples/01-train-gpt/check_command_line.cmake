# polyshard-train's command line and --config file: a TOML file sets the flags and the command
# line wins over it; a bad value, on the command line or in the file, and an unknown flag or key
# stop the run (exit 2) with a message naming them; --help exits 0 and shows every group. The
# runs that train are two steps of a one-block model.
set(failures "")

# expect(name EXIT code SAYS text... ARGS arg...): runs PROGRAM with the arguments and records a
# failure unless it exits with `code` and prints (on stdout or stderr) every `text`.
function(expect name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "EXIT" "SAYS;ARGS")
  execute_process(COMMAND ${PROGRAM} ${arg_ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  set(wrong "")
  if(NOT "${rc}" STREQUAL "${arg_EXIT}")
    string(APPEND wrong " exit ${rc}, not ${arg_EXIT};")
  endif()
  foreach(text IN LISTS arg_SAYS)
    string(FIND "${out}" "${text}" at)
    if(at EQUAL -1)
      string(APPEND wrong " no '${text}';")
    endif()
  endforeach()
  if(wrong)
    string(JOIN " " command ${arg_ARGS})
    set(failures "${failures}\n${name}:${wrong} polyshard-train ${command} printed:\n${out}" PARENT_SCOPE)
  endif()
endfunction()

# Keys are the long flags without their dashes; the sampling keys parse without --sample-every.
set(config ${WORK_DIR}/command-line.toml)
file(WRITE ${config} [=[
# a tiny run: one block, two steps, ZeRO-3 on two ranks
layers = 1
embd = 32
heads = 2
seq = 16
batch = 4
steps = 2
strategy = "zero3"
world-size = 2
log-every = 100
sample-tokens = 8
temperature = 0
top-k = 5
prompt = "The"
]=])
expect(config-sets-the-flags EXIT 0 ARGS --config ${config}
       SAYS "polyshard-train: GPT 1 layers, 2 heads, width 32, sequence 16" "strategy zero3" "2 rank(s)")
expect(command-line-wins-over-config EXIT 0 ARGS --config ${config} --layers 2 --strategy ddp --world-size 1
       SAYS "polyshard-train: GPT 2 layers, 2 heads, width 32, sequence 16" "strategy ddp" "1 rank(s)")
expect(command-line-wins-also-before-config EXIT 0 ARGS --heads 4 --config ${config}
       SAYS "polyshard-train: GPT 1 layers, 4 heads, width 32, sequence 16")

expect(bad-number-on-command-line EXIT 2 ARGS --layers abc SAYS "polyshard-train: --layers" "'abc'")
expect(number-below-its-minimum EXIT 2 ARGS --heads 0 SAYS "polyshard-train: --heads" "at least 1" "'0'")
expect(flag-without-value EXIT 2 ARGS --steps SAYS "polyshard-train: --steps")
expect(bad-betas EXIT 2 ARGS --betas 0.9 SAYS "polyshard-train: --betas" "B1,B2" "'0.9'")
expect(unknown-flag EXIT 2 ARGS --no-such-flag 3 SAYS "polyshard-train: " "--no-such-flag")
expect(init-hf-and-init EXIT 2 ARGS --init-hf ${WORK_DIR}/hf --init ${WORK_DIR}/w.safetensors
       SAYS "polyshard-train: --init-hf and --init")
expect(init-hf-and-resume EXIT 2 ARGS --init-hf ${WORK_DIR}/hf --resume ${WORK_DIR}/ckpt
       SAYS "polyshard-train: --init-hf and --resume")

set(bad_config ${WORK_DIR}/command-line-bad.toml)
file(WRITE ${bad_config} "layers = \"abc\"\n")
expect(bad-value-in-config EXIT 2 ARGS --config ${bad_config}
       SAYS "polyshard-train: --config ${bad_config}" "layers" "'abc'")
file(WRITE ${bad_config} "world-size = 0\n")
expect(value-below-its-minimum-in-config EXIT 2 ARGS --config ${bad_config} SAYS "world-size" "'0'")
file(WRITE ${bad_config} "strategy = \"zero4\"\n")
expect(unknown-word-in-config EXIT 2 ARGS --config ${bad_config} SAYS "--strategy" "zero4")
file(WRITE ${bad_config} "layerz = 2\n")
expect(unknown-key-in-config EXIT 2 ARGS --config ${bad_config} SAYS "polyshard-train: --config" "'layerz'")
expect(missing-config EXIT 2 ARGS --config ${WORK_DIR}/no-such-file.toml
       SAYS "polyshard-train: --config" "no-such-file.toml")

# Loss scaling reaches the engine: from 2^5, doubling after every step without overflow (the
# metrics give the scale after each step); a setting the precision has no use for stops the run.
set(tiny --layers 1 --embd 32 --heads 2 --seq 16 --batch 4 --steps 2 --log-every 100)
expect(loss-scale-settings-reach-the-engine EXIT 0 ARGS ${tiny} --precision fp16-mixed --initial-scale-power 5
       --loss-scale-window 1 --metrics ${WORK_DIR}/loss-scale.jsonl)
file(STRINGS ${WORK_DIR}/loss-scale.jsonl scale_lines)
if(NOT scale_lines MATCHES "\"loss_scale\":64,.*;.*\"loss_scale\":128,")
  set(failures "${failures}\nloss-scale-settings-reach-the-engine: the scales after the two steps are not 64 and 128: ${scale_lines}")
endif()
expect(static-loss-scale EXIT 0 ARGS ${tiny} --precision fp16-mixed --loss-scale 8 --metrics ${WORK_DIR}/static.jsonl)
file(STRINGS ${WORK_DIR}/static.jsonl static_lines)
if(NOT static_lines MATCHES "\"loss_scale\":8,.*;.*\"loss_scale\":8,")
  set(failures "${failures}\nstatic-loss-scale: the scale is not 8 after both steps: ${static_lines}")
endif()
expect(loss-scale-setting-without-loss-scaling EXIT 2 ARGS ${tiny} --precision bf16-mixed --hysteresis 3
       SAYS "StrategyConfig::hysteresis" "scales no loss")
expect(loss-scale-window-below-one EXIT 2 ARGS --loss-scale-window 0 SAYS "polyshard-train: --loss-scale-window" "at least 1")

# Lightning's strategy names run the composition its DeepSpeed or FairScale settings make; the
# one whose meaning polyshard does not have is refused, naming what differs.
set(one_step --layers 1 --embd 32 --heads 2 --seq 16 --batch 4 --steps 1 --log-every 100)
foreach(pair "deepspeed_stage_1=ShardOptimizerState, NoOffload"
             "deepspeed_stage_2=ShardGradients, NoOffload"
             "deepspeed_stage_2_offload=ShardGradients, OffloadOptimizer<Cpu>"
             "deepspeed_stage_3=ShardParameters, NoOffload"
             "deepspeed_stage_3_offload=ShardParameters, OffloadParameters<Cpu>"
             "ddp_sharded=ShardGradients, NoOffload"
             "fsdp=ShardParameters, NoOffload")
  string(REPLACE "=" ";" pair "${pair}")
  list(GET pair 0 name)
  list(GET pair 1 composition)
  expect(lightning-name-${name} EXIT 0 ARGS ${one_step} --strategy ${name} SAYS "strategy ${name} (${composition}, Fp32)")
endforeach()
expect(lightning-name-deepspeed_stage_3_offload_nvme EXIT 2 ARGS ${one_step} --strategy deepspeed_stage_3_offload_nvme
       SAYS "deepspeed_stage_3_offload_nvme keeps the parameters on NVMe" "--strategy zero_infinity")

expect(help EXIT 0 ARGS --help
       SAYS "--config FILE" "Model:" "Training:" "Optimizer:" "Strategy:" "Data:" "Output:" "Checkpoints:" "Sampling:"
            "Loss scaling" "--initial-scale-power N" "--layers N=4" "--betas B1,B2=0.9,0.999" "--nesterov" "--sample-tokens N=32" "--top-k K=0")
expect(short-help EXIT 0 ARGS -h SAYS "Usage: polyshard-train")

if(failures)
  message(FATAL_ERROR "polyshard-train's command line:${failures}")
endif()
message(STATUS "command line: --config sets the flags, the command line wins, bad input is named, --help shows the groups")
