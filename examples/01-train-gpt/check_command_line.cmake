# polyshard-train's command line and --config file: a TOML file sets the flags and the command
# line wins over it; a bad value, on the command line or in the file, and an unknown flag or key
# stop the run (exit 2) with a message naming them; --help exits 0 and shows every group. The
# runs that train are two steps of a one-block model.
set(failures "")

# expect(name EXIT code SAYS text... ARGS arg... [ENV VAR=value...]): runs PROGRAM with the
# arguments (and the environment variables ENV sets) and records a failure unless it exits with
# `code` and prints (on stdout or stderr) every `text`.
function(expect name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "EXIT" "SAYS;ARGS;ENV")
  set(environment "")
  if(arg_ENV)
    set(environment ${CMAKE_COMMAND} -E env ${arg_ENV})
  endif()
  execute_process(COMMAND ${environment} ${PROGRAM} ${arg_ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE out)
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

# Lightning's strategy names run the composition its DeepSpeed or FairScale settings make.
set(one_step --layers 1 --embd 32 --heads 2 --seq 16 --batch 4 --steps 1 --log-every 100)
foreach(pair "deepspeed=ShardGradients, NoOffload"
             "deepspeed_stage_1=ShardOptimizerState, NoOffload"
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
file(MAKE_DIRECTORY ${WORK_DIR}/lightning-nvme)
expect(lightning-name-deepspeed_stage_3_offload_nvme EXIT 0 ARGS ${one_step} --strategy deepspeed_stage_3_offload_nvme
       --nvme-path ${WORK_DIR}/lightning-nvme
       SAYS "strategy deepspeed_stage_3_offload_nvme (ShardParameters, OffloadParameters<Nvme>, Fp32)")

# fp16-mixed scales the loss as each name's reference does (Lightning's precision=16): PyTorch's
# GradScaler under DDP, ShardedDDP, FSDP and the hybrid shard, DeepSpeed's scaler under the ZeRO
# and DeepSpeed names; every engine of each kind is named once.
foreach(pair "ddp=Fp16Amp" "sharded_ddp=Fp16Amp" "ddp_sharded=Fp16Amp" "fsdp=Fp16Amp" "fsdp_grad_op=Fp16Amp"
             "hybrid=Fp16Amp" "deepspeed_stage_2=Fp16Mixed" "zero3=Fp16Mixed" "zero1=Fp16Mixed")
  string(REPLACE "=" ";" pair "${pair}")
  list(GET pair 0 name)
  list(GET pair 1 precision)
  expect(fp16-scaler-of-${name} EXIT 0 ARGS ${one_step} --world-size 2 --precision fp16-mixed --strategy ${name}
         SAYS "strategy ${name} (" ", ${precision})")
endforeach()
# The two rules, told apart by overflows: a scale of 2^40 overflows fp16's gradients at every step.
# GradScaler halves at each overflow (2^39, then 2^38); DeepSpeed's hysteresis of 2 lets the first
# pass and halves at the second (2^40, then 2^39). Each metrics line is JSON (a skipped step's
# gradient norm is null). The settings only one scaler has are refused.
foreach(pair "fsdp=549755813888;274877906944" "deepspeed_stage_3=1099511627776;549755813888")
  string(REPLACE "=" ";" pair "${pair}")
  list(POP_FRONT pair name)
  expect(fp16-overflows-under-${name} EXIT 0 ARGS ${one_step} --steps 2 --precision fp16-mixed --strategy ${name}
         --initial-scale-power 40 --metrics ${WORK_DIR}/overflows-${name}.jsonl)
  file(STRINGS ${WORK_DIR}/overflows-${name}.jsonl lines)
  set(seen "")
  foreach(line IN LISTS lines)
    string(JSON scale ERROR_VARIABLE error GET "${line}" loss_scale)
    string(JSON norm ERROR_VARIABLE error TYPE "${line}" grad_norm)
    string(JSON skipped ERROR_VARIABLE error GET "${line}" skipped)
    if(error)
      set(failures "${failures}\nfp16-overflows-under-${name}: a metrics line is not JSON (${error}): ${line}")
    endif()
    list(APPEND seen "${scale}/${norm}/${skipped}")
  endforeach()
  list(TRANSFORM pair APPEND "/NULL/ON" OUTPUT_VARIABLE expected)
  if(NOT seen STREQUAL expected)
    set(failures "${failures}\nfp16-overflows-under-${name}: scale/grad_norm/skipped after two overflows: ${seen}, not ${expected}")
  endif()
endforeach()
expect(grad-scaler-has-no-hysteresis EXIT 2 ARGS ${one_step} --precision fp16-mixed --strategy fsdp --hysteresis 3
       SAYS "StrategyConfig::hysteresis" "GradScaler")
expect(deepspeed-scaler-has-hysteresis-and-floor EXIT 0 ARGS ${one_step} --precision fp16-mixed
       --strategy deepspeed_stage_3 --hysteresis 3 --min-loss-scale 2 SAYS "strategy deepspeed_stage_3 (")

# The offload families beside ZeRO-Offload's: ZeRO-1 and ZeRO-3 with the optimizer on the host, and
# ZeRO-3 with the parameter shards alone there. On the host engine the offload moves nothing, so
# each trains exactly as its family without offload: equal losses and gradient norms at every
# step, on two ranks.
foreach(pair "zero1_offload=ShardOptimizerState, OffloadOptimizer<Cpu>=zero1"
             "zero3_offload_optimizer=ShardParameters, OffloadOptimizer<Cpu>=zero3"
             "zero3_offload_parameters=ShardParameters, OffloadParametersOnly<Cpu>=zero3")
  string(REPLACE "=" ";" pair "${pair}")
  list(GET pair 0 name)
  list(GET pair 1 composition)
  list(GET pair 2 without)
  set(figures "")
  foreach(run ${name} ${without})
    expect(offload-family-${run} EXIT 0 ARGS ${one_step} --steps 3 --world-size 2 --strategy ${run}
           --metrics ${WORK_DIR}/family-${run}.jsonl SAYS "strategy ${run} (")
    file(STRINGS ${WORK_DIR}/family-${run}.jsonl lines)
    set(these "")
    foreach(line IN LISTS lines)
      string(JSON loss GET "${line}" loss)
      string(JSON norm GET "${line}" grad_norm)
      string(APPEND these "${loss}/${norm} ")
    endforeach()
    list(APPEND figures "${these}")
  endforeach()
  expect(offload-family-${name}-composition EXIT 0 ARGS ${one_step} --strategy ${name}
         SAYS "strategy ${name} (${composition}, Fp32)")
  list(GET figures 0 with_offload)
  list(GET figures 1 without_offload)
  if(NOT with_offload STREQUAL without_offload OR with_offload STREQUAL "")
    set(failures "${failures}\noffload-family-${name}: losses/norms ${with_offload}, ${without}'s ${without_offload}")
  endif()
endforeach()

# --deepspeed-config: a DeepSpeed JSON config using every key polyshard-train reads trains
# exactly as the same settings given as flags (the metrics equal but for the timings), and the
# composition it names is the one DeepSpeed's stage and offload sections make.
set(tiny_model --layers 1 --embd 32 --heads 2 --seq 16 --steps 3 --world-size 2)
set(every_key ${WORK_DIR}/deepspeed-every-key.json)
file(WRITE ${every_key} [=[
{
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 0.5,
  "steps_per_print": 100,
  "wall_clock_breakdown": false,
  "zero_allow_untested_optimizer": true,
  "prescale_gradients": false,
  "gradient_predivide_factor": 1.0,
  "communication_data_type": null,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
  "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 2, "hysteresis": 2,
           "consecutive_hysteresis": false, "min_loss_scale": 1, "auto_cast": false,
           "fp16_master_weights_and_grads": false},
  "bf16": {"enabled": false},
  "zero_optimization": {
    "stage": 2, "contiguous_gradients": true, "overlap_comm": true, "reduce_scatter": true,
    "reduce_bucket_size": 2e8, "allgather_partitions": true, "allgather_bucket_size": 200000000,
    "round_robin_gradients": false, "elastic_checkpoint": false, "sub_group_size": 1000,
    "stage3_prefetch_bucket_size": 5e7, "stage3_param_persistence_threshold": 1e5,
    "stage3_model_persistence_threshold": 1e9, "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
    "stage3_gather_16bit_weights_on_model_save": true,
    "offload_optimizer": {"device": "cpu", "nvme_path": "/local_nvme", "pin_memory": false, "buffer_count": 4,
                          "fast_init": false, "ratio": 1.0}
  },
  "activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": false,
    "contiguous_memory_optimization": false, "number_checkpoints": null, "synchronize_checkpoint_boundary": false,
    "profile": false}
}
]=])
expect(deepspeed-config-every-key EXIT 0 ARGS ${tiny_model} --deepspeed-config ${every_key}
       --metrics ${WORK_DIR}/deepspeed-config.jsonl
       SAYS "strategy zero_offload (ShardGradients, OffloadOptimizer<Cpu>, Fp16Mixed)" "batch 8 in 2 micro-batch(es)"
            "optimizer adamw, lr 0.003" "stage3_prefetch_bucket_size: read by DeepSpeed's stage 3 only"
            "stage3_max_reuse_distance = 1000000000" "the results do not")
expect(deepspeed-config-as-flags EXIT 0 ARGS ${tiny_model} --strategy zero_offload --precision fp16-mixed --batch 8
       --accum 2 --clip 0.5 --log-every 100 --optimizer adamw --lr 3e-3 --betas 0.8,0.95 --eps 1e-6
       --weight-decay 0.1 --initial-scale-power 12 --loss-scale-window 2 --checkpoint-activations
       --sub-group-size 1000 --metrics ${WORK_DIR}/deepspeed-flags.jsonl)
# StrategyConfig's name for --accum, as DeepSpeed's key names it, on the command line and in --config.
expect(gradient-accumulation-steps-flag EXIT 0 ARGS ${tiny_model} --batch 8 --gradient-accumulation-steps 2
       SAYS "batch 8 in 2 micro-batch(es)")
file(WRITE ${WORK_DIR}/accumulation.toml "gradient-accumulation-steps = 4\n")
expect(gradient-accumulation-steps-config EXIT 0 ARGS ${tiny_model} --batch 8 --config ${WORK_DIR}/accumulation.toml
       SAYS "batch 8 in 4 micro-batch(es)")
set(runs "")
foreach(run deepspeed-config deepspeed-flags)
  file(READ ${WORK_DIR}/${run}.jsonl text)
  string(REGEX REPLACE "\"tokens_per_s\":[^,]*,\"step_s\":[^,]*,\"elapsed_s\":[^,]*," "" text "${text}")
  list(APPEND runs "${text}")
endforeach()
list(GET runs 0 from_config)
list(GET runs 1 from_flags)
if(NOT from_config STREQUAL from_flags OR from_config STREQUAL "")
  set(failures "${failures}\ndeepspeed-config-every-key: its metrics differ from the same settings as flags:\n"
               "${from_config}\n---\n${from_flags}")
endif()
# The command line wins over the file; DeepSpeed's Adam is AdamW with weight decay 0 by default.
file(WRITE ${WORK_DIR}/deepspeed-stage3.json
     [=[{"zero_optimization": {"stage": 3}, "optimizer": {"type": "Adam", "params": {"lr": 0.002}}, "bf16": {"enabled": true}}]=])
expect(deepspeed-config-stage-3 EXIT 0 ARGS ${one_step} --deepspeed-config ${WORK_DIR}/deepspeed-stage3.json
       SAYS "strategy zero3 (ShardParameters, NoOffload, Bf16Mixed)" "optimizer adamw, lr 0.002")
expect(deepspeed-config-command-line-wins EXIT 0 ARGS ${one_step} --deepspeed-config ${WORK_DIR}/deepspeed-stage3.json
       --strategy ddp --lr 0.01 SAYS "strategy ddp (NoShard, NoOffload, Bf16Mixed)" "lr 0.01")
file(WRITE ${WORK_DIR}/deepspeed-offload3.json
     [=[{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}}]=])
expect(deepspeed-config-stage-3-offload EXIT 0 ARGS ${one_step} --deepspeed-config ${WORK_DIR}/deepspeed-offload3.json
       SAYS "strategy zero3_offload (ShardParameters, OffloadParameters<Cpu>, Fp32)")
# offload_param alone: the parameter shards on the host, the optimizer where the model computes.
file(WRITE ${WORK_DIR}/deepspeed-offload-param.json
     [=[{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}]=])
expect(deepspeed-config-stage-3-offload-param EXIT 0 ARGS ${one_step}
       --deepspeed-config ${WORK_DIR}/deepspeed-offload-param.json
       SAYS "strategy zero3_offload_parameters (ShardParameters, OffloadParametersOnly<Cpu>, Fp32)")
# Both offloads on NVMe: the parameter shards go to the file too, with their buffer settings.
file(MAKE_DIRECTORY ${WORK_DIR}/deepspeed-nvme)
file(WRITE ${WORK_DIR}/deepspeed-nvme.json
     "{\"zero_optimization\": {\"stage\": 3, "
     "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"${WORK_DIR}/deepspeed-nvme\", "
     "\"buffer_count\": 8}, "
     "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"${WORK_DIR}/deepspeed-nvme\", \"buffer_count\": 1, "
     "\"buffer_size\": 1e8, \"max_in_cpu\": 0}}, "
     "\"aio\": {\"block_size\": 1048576, \"queue_depth\": 8, \"single_submit\": false, \"overlap_events\": true, "
     "\"thread_count\": 1}}")
expect(deepspeed-config-stage-3-nvme EXIT 0 ARGS ${one_step} --deepspeed-config ${WORK_DIR}/deepspeed-nvme.json
       SAYS "strategy zero_infinity_parameters (ShardParameters, OffloadParameters<Nvme>, Fp32)")
# aio's sizes reach the swap files: a block size that is no multiple of 4096 is refused there.
file(READ ${WORK_DIR}/deepspeed-nvme.json nvme_json)
string(REPLACE "\"block_size\": 1048576" "\"block_size\": 1000" nvme_json "${nvme_json}")
file(WRITE ${WORK_DIR}/deepspeed-nvme-block.json "${nvme_json}")
expect(deepspeed-config-aio-reaches-the-file EXIT 2 ARGS ${one_step}
       --deepspeed-config ${WORK_DIR}/deepspeed-nvme-block.json
       SAYS "block_size must be a positive multiple of 4096 bytes, got 1000")
foreach(pair "1=zero1_offload (ShardOptimizerState" "3=zero3_offload_optimizer (ShardParameters")
  string(REPLACE "=" ";" pair "${pair}")
  list(GET pair 0 stage)
  list(GET pair 1 says)
  file(WRITE ${WORK_DIR}/deepspeed-offload-optimizer-${stage}.json
       "{\"zero_optimization\": {\"stage\": ${stage}, \"offload_optimizer\": {\"device\": \"cpu\"}}}")
  expect(deepspeed-config-stage-${stage}-offload-optimizer EXIT 0 ARGS ${one_step}
         --deepspeed-config ${WORK_DIR}/deepspeed-offload-optimizer-${stage}.json SAYS "strategy ${says}, OffloadOptimizer<Cpu>")
endforeach()
# deepspeed_refusal(NAME JSON SAYS...): polyshard-train given the config JSON (written to a file
# named after NAME) stops with exit 2, printing each of SAYS. A macro: expect's failures reach
# the caller's scope.
macro(deepspeed_refusal name json)
  file(WRITE ${WORK_DIR}/deepspeed-${name}.json "${json}")
  expect(deepspeed-config-${name} EXIT 2 ARGS ${one_step} --deepspeed-config ${WORK_DIR}/deepspeed-${name}.json
         SAYS ${ARGN})
endmacro()
# What cannot be honoured is refused, naming the file and the key.
set(refused "polyshard cannot honour")
set(contiguous "zero_optimization.contiguous_gradients: ${refused}")
set(beyond_int "must be at most 2147483647")  # an int field's largest value
set(buffer_count "zero_optimization.offload_optimizer.buffer_count: ${beyond_int}")
foreach(case
    "unknown-key|{\"zero_optimization\": {\"stage\": 3, \"stage_three\": 1}}|zero_optimization.stage_three: no such key"
    "wrong-type|{\"fp16\": {\"enabled\": \"yes\"}}|fp16.enabled: expects true or false"
    "fractional-stage|{\"zero_optimization\": {\"stage\": 2.5}}|zero_optimization.stage: expects an integer"
    "not-json|{\"fp16\": |not JSON"
    "nvme-parameters|{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\"}}}|without offload_optimizer nvme"
    "param-offload-below-stage-3|{\"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": \"cpu\"}}}|needs stage 3"
    "fp16-and-bf16|{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}|both are true"
    "scheduler|{\"scheduler\": {\"type\": \"WarmupLR\"}}|scheduler: ${refused}"
    "consecutive-hysteresis|{\"fp16\": {\"enabled\": true, \"consecutive_hysteresis\": true}}|fp16.consecutive_hysteresis: polyshard-train cannot honour"
    "optimizer-type|{\"optimizer\": {\"type\": \"Lamb\"}}|optimizer.type: 'Lamb' is not one of"
    "partitioned-activations|{\"activation_checkpointing\": {\"partition_activations\": true}}|partition_activations"
    "scattered-gradients|{\"zero_optimization\": {\"stage\": 2, \"contiguous_gradients\": false}}|${contiguous}"
    "single-submit|{\"aio\": {\"single_submit\": true}}|aio.single_submit: ${refused}"
    "no-overlap-events|{\"aio\": {\"overlap_events\": false}}|aio.overlap_events: ${refused}"
    "aio-threads|{\"aio\": {\"thread_count\": 2}}|aio.thread_count: ${refused}"
    "queue-depth-big|{\"aio\": {\"queue_depth\": 3e9}}|aio.queue_depth: ${beyond_int}"
    "buffer-count-big|{\"zero_optimization\": {\"offload_optimizer\": {\"buffer_count\": 3e9}}}|${buffer_count}")
  string(REPLACE "|" ";" case "${case}")
  list(GET case 0 name)
  list(GET case 1 json)
  list(GET case 2 says)
  deepspeed_refusal(${name} "${json}" "--deepspeed-config ${WORK_DIR}/deepspeed-${name}.json" "${says}")
endforeach()
# The activation-checkpointing settings reach the engine, which refuses them on a host model (and
# the contiguous buffer without cpu_checkpointing).
foreach(key synchronize_checkpoint_boundary cpu_checkpointing contiguous_memory_optimization)
  deepspeed_refusal(${key} "{\"activation_checkpointing\": {\"${key}\": true}}" "StrategyConfig::${key} = true")
endforeach()
# --device: auto (the default), cpu or cuda; what auto picks is checked on the emulated device
# (check_auto_device.cmake).
expect(batch-below-world EXIT 2 ARGS ${one_step} --world-size 5
       SAYS "--batch 4 in 1 micro-batch(es) is 4 row(s) a micro-batch for 5 rank(s): each rank needs at least one")
expect(device-unknown EXIT 2 ARGS ${one_step} --device gpu SAYS "--device must be auto, cpu or cuda, got 'gpu'")
# --parallel-devices (Lightning's parallel_devices): one GPU of its own per rank, for --device cuda.
expect(parallel-devices-need-cuda EXIT 2 ARGS ${one_step} --device cpu --world-size 2 --parallel-devices 0,1
       SAYS "--parallel-devices lists GPUs, for --device cuda (or auto) only")
expect(parallel-devices-once-each EXIT 2 ARGS ${one_step} --device cuda --world-size 2 --parallel-devices 1,1
       SAYS "--parallel-devices names GPU 1 twice")
expect(parallel-devices-one-per-rank EXIT 2 ARGS ${one_step} --device cuda --world-size 3 --parallel-devices 0,1
       SAYS "--parallel-devices lists 2 GPU(s) for --world-size 3")
# StrategyConfig's flags reach the engine, which refuses a field its strategy does not read.
expect(strategy-setting-reaches-the-engine EXIT 2 ARGS ${one_step} --allgather-bucket-size 10
       SAYS "StrategyConfig::allgather_bucket_size = 10")
expect(delayed-update-needs-offload EXIT 2 ARGS ${one_step} --delayed-parameter-update true
       SAYS "StrategyConfig::delayed_parameter_update is read only under OffloadOptimizer<Cpu>")
expect(move-grads-to-cpu-reaches-the-engine EXIT 2 ARGS ${one_step} --move-grads-to-cpu false
       SAYS "StrategyConfig::move_grads_to_cpu = false" "host model")
expect(move-grads-to-cpu-where-they-go EXIT 0 ARGS ${one_step} --strategy zero3 --move-grads-to-cpu true
       SAYS "strategy zero3 (ShardParameters, NoOffload, Fp32)")
expect(delayed-update-trains EXIT 0 ARGS ${one_step} --strategy zero_offload --precision bf16-mixed
       --delayed-parameter-update true SAYS "strategy zero_offload (ShardGradients, OffloadOptimizer<Cpu>, Bf16Mixed)")
expect(bucket-size-must-be-positive EXIT 2 ARGS ${one_step} --reduce-bucket-size 0
       SAYS "--reduce-bucket-size: must be at least 1, got '0'")
file(WRITE ${WORK_DIR}/deepspeed-pinned.json [=[{"zero_optimization": {"stage": 2, "offload_optimizer": {
  "device": "none", "pin_memory": true}}}]=])
expect(deepspeed-setting-reaches-the-engine EXIT 2 ARGS ${one_step} --deepspeed-config ${WORK_DIR}/deepspeed-pinned.json
       SAYS "StrategyConfig::pin_memory = true" "a host model")
expect(reduce-buffer-size-not-negative EXIT 2 ARGS ${one_step} --reduce-buffer-size -1
       SAYS "--reduce-buffer-size: must be at least 0, got '-1'")

# --decay-matrices-only exempts biases and norms from AdamW's decay: a large decay then trains
# to another loss (the engine's exemption itself: tests/engine/test_weight_decay.cpp).
include(${CMAKE_CURRENT_LIST_DIR}/train_losses.cmake)  # train, count_trace_events
set(common ${one_step} --steps 3 --weight-decay 0.5 --lr 0.01)
train(all_decayed)
train(matrices_decayed --decay-matrices-only)
list(GET all_decayed -1 all_last)
list(GET matrices_decayed -1 matrices_last)
if(all_last STREQUAL matrices_last)
  string(APPEND failures "\ndecay-matrices-only: the same last step and loss '${all_last}' with and without")
endif()

# Hugging Face's ZeRO-3 template ("auto" values, DeepSpeed's stage 3 scheduling keys) trains, the
# keys without a setting here named in a note.
file(WRITE ${WORK_DIR}/deepspeed-hf-zero3.json [=[{"zero_optimization": {"stage": 3, "overlap_comm": true,
  "contiguous_gradients": true, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
  "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
  "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
  "stage3_gather_16bit_weights_on_model_save": true}, "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto", "steps_per_print": 2000, "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false}]=])
expect(deepspeed-hf-zero3-template EXIT 0 ARGS ${one_step} --deepspeed-config ${WORK_DIR}/deepspeed-hf-zero3.json
       SAYS "strategy zero3 (ShardParameters" "note: --deepspeed-config ${WORK_DIR}/deepspeed-hf-zero3.json: "
            "stage3_max_live_parameters = 1000000000" "the results do not")

# --wall-clock-breakdown, and DeepSpeed's wall_clock_breakdown: the mean forward, backward and
# step times with each printed loss; backward and step then run apart, to the same losses.
file(WRITE ${WORK_DIR}/deepspeed-timed.json [=[{"wall_clock_breakdown": true,
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}]=])
train(untimed --strategy zero_offload --world-size 2)
train(timed --strategy zero_offload --world-size 2 --wall-clock-breakdown)
train(timed_by_config --deepspeed-config ${WORK_DIR}/deepspeed-timed.json --world-size 2)
set(breakdown "time \\(ms\\) per step, mean of [12] \\| forward [0-9.]+ \\| backward [0-9.]+ \\| step [0-9.]+")
file(READ ${WORK_DIR}/timed.jsonl timed_metrics)
file(READ ${WORK_DIR}/untimed.jsonl untimed_metrics)
if(NOT timed STREQUAL untimed OR NOT timed_by_config STREQUAL untimed OR NOT timed_out MATCHES "${breakdown}" OR
   NOT timed_by_config_out MATCHES "${breakdown}" OR untimed_out MATCHES "time \\(ms\\)" OR
   NOT timed_metrics MATCHES "\"wall_clock\":{\"forward_s\":[0-9.e-]+,\"backward_s\":[0-9.e-]+,\"optimizer_step_s\""
   OR untimed_metrics MATCHES "wall_clock")
  string(APPEND failures "\nwall-clock-breakdown: losses ${timed}, ${timed_by_config} against ${untimed}; printed:\n"
         "${timed_out}\n${timed_by_config_out}")
endif()

# A ZeRO-2 DeepSpeed config's allgather_bucket_size cuts the all-gather of the updated shards
# (its pieces and their bits: tests/engine/test_allgather_pieces.cpp): accepted, the same losses.
file(WRITE ${WORK_DIR}/deepspeed-allgather.json [=[{"zero_optimization": {"stage": 2, "allgather_bucket_size": 64}}]=])
train(gathered_whole --strategy zero2 --world-size 2)
train(gathered_in_pieces --deepspeed-config ${WORK_DIR}/deepspeed-allgather.json --world-size 2)
if(NOT gathered_in_pieces STREQUAL gathered_whole OR NOT gathered_in_pieces_out MATCHES "strategy zero2")
  string(APPEND failures "\ndeepspeed-allgather-bucket: losses ${gathered_in_pieces} against ${gathered_whole}:\n"
         "${gathered_in_pieces_out}")
endif()

# A launcher's processes (here told by PMI_SIZE, as MPICH's Hydra and Slurm's srun tell them) do
# not each train alone as a world of threads (mpirun itself: check_mpirun.cmake).
expect(threads-under-a-launcher EXIT 2 ENV PMI_SIZE=3 ARGS ${one_step} --backend threads
       SAYS "--backend threads, and the launcher (mpirun, srun) started 3 processes")
# Slurm's srun --mpi=pmix sets neither Open MPI's variables nor PMI_SIZE: its job step's count.
expect(threads-under-srun EXIT 2 ENV SLURM_STEP_NUM_TASKS=3 ARGS ${one_step} --backend threads
       SAYS "--backend threads, and the launcher (mpirun, srun) started 3 processes")

# FairScale's reduce_buffer_size by name: sharded_ddp carries ShardedDataParallel's 2^23 elements
# (one bucket holds this model's unit), ddp_sharded Lightning's 0 on one machine (each parameter
# reduced alone), and a bucket flag overrides either; counted as the reductions in each run's trace.
function(reductions out)
  set(trace ${WORK_DIR}/reductions.json)
  file(REMOVE ${trace})
  execute_process(COMMAND ${PROGRAM} ${one_step} --world-size 2 ${ARGN} --trace ${trace} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE printed ERROR_VARIABLE printed)
  set(n 0)
  if(rc EQUAL 0 AND EXISTS ${trace})
    count_trace_events(${trace} reduce n)
  else()
    string(JOIN " " command ${ARGN})
    set(failures "${failures}\nreductions: polyshard-train ${command} exited ${rc}:\n${printed}" PARENT_SCOPE)
  endif()
  set(${out} ${n} PARENT_SCOPE)
endfunction()
reductions(fairscale --strategy sharded_ddp)
reductions(lightning --strategy ddp_sharded)
reductions(fairscale_unbatched --strategy sharded_ddp --reduce-buffer-size 0)
reductions(lightning_batched --strategy ddp_sharded --reduce-buffer-size 8388608)
reductions(lightning_capped --strategy ddp_sharded --bucket-cap-mb 25)  # another cap replaces the name's
if(NOT (fairscale GREATER 0 AND lightning GREATER fairscale AND fairscale_unbatched EQUAL lightning AND
        lightning_batched EQUAL fairscale AND lightning_capped EQUAL fairscale))
  string(APPEND failures "\nreduce-buffer-size-by-name: reductions sharded_ddp ${fairscale}, ddp_sharded ${lightning}, "
         "sharded_ddp with 0 ${fairscale_unbatched}, ddp_sharded with 8388608 ${lightning_batched}, ddp_sharded "
         "with --bucket-cap-mb 25 ${lightning_capped}")
endif()

# A setting the strategy does not read is refused, naming it and the policy that ignores it.
expect(nvme-path-without-nvme-offload EXIT 2 ARGS ${one_step} --strategy zero3 --nvme-path ${WORK_DIR}
       SAYS "NVMe settings (nvme_path '${WORK_DIR}'" "NoOffload")
# allgather_bucket_size belongs to stages 1 and 2, stage3_prefetch_bucket_size to sharded parameters.
expect(allgather-bucket-under-zero3 EXIT 2 ARGS ${one_step} --strategy zero3 --allgather-bucket-size 10
       SAYS "allgather_bucket_size = 10" "DeepSpeed's stage 3 does not read it")
expect(stage3-prefetch-under-zero2 EXIT 2 ARGS ${one_step} --strategy zero2 --stage3-prefetch-bucket-size 10
       SAYS "stage3_prefetch_bucket_size = 10" "gathers no parameters")
expect(stage3-prefetch-under-zero3 EXIT 0 ARGS ${one_step} --strategy zero3 --stage3-prefetch-bucket-size 100000
       SAYS "done: loss")
expect(remote-device-where-built EXIT 0 ARGS ${one_step} --strategy zero3 --remote-device cpu SAYS "done: loss")
expect(remote-device-elsewhere EXIT 2 ARGS ${one_step} --strategy zero3 --remote-device nvme
       SAYS "remote_device = 'nvme' builds the parameters there first" "host memory (a host model)")
expect(hybrid-group-without-hybrid EXIT 2 ARGS ${one_step} --strategy ddp --hybrid-group 1
       SAYS "hybrid_group_size = 1 is read only by HybridShard")

# The partition of the optimizer state by name: FairScale's OSS (each parameter whole on one rank)
# under sharded_ddp and ddp_sharded, even slices under the ZeRO names, --partition over either;
# refused where the parameters are sharded or nothing is.
foreach(run "sharded_ddp=whole_parameters" "ddp_sharded=whole_parameters" "zero2=flat_slices"
            "deepspeed_stage_1=flat_slices" "zero1 --partition whole_parameters=whole_parameters"
            "sharded_ddp --partition flat_slices=flat_slices" "zero3=none" "ddp=none")
  string(REPLACE "=" ";" run "${run}")
  list(GET run 0 flags)
  list(GET run 1 partition)
  separate_arguments(flags)
  string(JOIN "-" name ${flags})
  file(REMOVE ${WORK_DIR}/partition.jsonl)
  expect(partition-${name} EXIT 0 ARGS ${one_step} --world-size 2 --strategy ${flags}
         --metrics ${WORK_DIR}/partition.jsonl SAYS "done: loss")
  set(said "no metrics")
  if(EXISTS ${WORK_DIR}/partition.jsonl)
    file(READ ${WORK_DIR}/partition.jsonl line)
    string(JSON said GET "${line}" partition)
  endif()
  if(NOT said STREQUAL partition)
    string(APPEND failures "\npartition-${name}: the metrics say partition '${said}', not '${partition}'")
  endif()
endforeach()
expect(whole-parameters-under-zero3 EXIT 2 ARGS ${one_step} --strategy zero3 --partition whole_parameters
       SAYS "StrategyConfig::partition = whole_parameters" "ShardParameters, whose parameter shards are even slices")
expect(whole-parameters-under-ddp EXIT 2 ARGS ${one_step} --strategy ddp --partition whole_parameters
       SAYS "StrategyConfig::partition = whole_parameters" "NoShard, which partitions nothing")
expect(unknown-partition EXIT 2 ARGS ${one_step} --strategy zero2 --partition oss SAYS "--partition" "oss")

# DeepSpeed's train_batch_size = micro batch x accumulation x world size, checked once the world is known.
file(WRITE ${WORK_DIR}/deepspeed-batches.json [=[{"train_batch_size": 6, "train_micro_batch_size_per_gpu": 2}]=])
expect(deepspeed-config-micro-batch-against-batch EXIT 2 ARGS --layers 1 --embd 32 --heads 2 --seq 16 --steps 1
       --world-size 2 --deepspeed-config ${WORK_DIR}/deepspeed-batches.json
       SAYS "--deepspeed-config ${WORK_DIR}/deepspeed-batches.json" "x 2 rank(s) is 4, not the batch 6")

expect(help EXIT 0 ARGS --help
       SAYS "--config FILE" "Model:" "Training:" "Optimizer:" "Strategy:" "Data:" "Output:" "Checkpoints:" "Sampling:"
            "Loss scaling" "Strategy settings" "--deepspeed-config FILE.json"
            "--reduce-bucket-size N          elements reduced at once (DeepSpeed; default 200000000 under the zero"
            "--initial-scale-power N" "--layers N=4" "--betas B1,B2=0.9,0.999" "--nesterov" "--sample-tokens N=32" "--top-k K=0")
expect(short-help EXIT 0 ARGS -h SAYS "Usage: polyshard-train")

if(failures)
  message(FATAL_ERROR "polyshard-train's command line:${failures}")
endif()
message(STATUS "command line: --config and --deepspeed-config set the flags, the command line wins, bad input is named, --help shows the groups")
