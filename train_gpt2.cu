// The trainer: flags -> plan -> model -> task -> training loop. Plain host code for both backends:
//   g++ -x c++ -DLLMC_CPU  -> train_gpt2cpu  (fp32 reference kernels, OpenMP)
//   nvcc                   -> train_gpt2cu   (CUDA kernels, bf16 mixed precision)
// The same main runs one rank or many (mpirun), with or without MPI in the build: everything
// about the ranks is in the plan (llmc/plan/parallel_plan.h), everything about the data and the loss
// in the task (llmc/tasks/task.h, llmc/tasks/). One optimizer step (doc/architecture.md):
//   task.begin_step   this step's micro-batches (and the loss scale dloss)
//   train_step:
//     plan_zero_grad  gradients to zero (wherever the placement keeps them)
//     plan.step.run   forward, loss, backward of each micro-batch (llmc/model/step.h; the ops and
//                     placement hooks run inside the passes)
//     plan_update     clip and AdamW on what this rank owns; parameters back in sync
// Evaluation, samples and checkpoints happen before a step (and once after the last one: task_between_steps).
#include "llmc/common.h"
#include "llmc/train/train_args_check.h"
#include "llmc/model/gpt2.h"
#include "llmc/train/lr_schedule.h"
#include "llmc/model/sampler.h"
#include "llmc/plan/log.h"
#include "llmc/trace.h"
#include "llmc/model/step.h"
#include "llmc/train/parallel_plan_report.h"
#include "llmc/planner/planner.h"
#include "llmc/train/guard.h"
#include "llmc/train/outputs.h"
#include "llmc/tasks/task_run.h"
#include "llmc/train/state_load.h"
#include "llmc/train/state_save.h"
#include "llmc/train/data_ahead.h"
#include "llmc/train/loss_scale.h"

// One optimizer step on the task's micro-batches (begin_step fetched them): gradients to zero,
// forward, loss and backward of each micro-batch, clip and AdamW. Returns the step's loss (the
// task's, the mean over the ranks); *norm is the gradient norm before clipping.
static float train_step(Plan* plan, GPT2* model, Task* task, int grad_accum, float dloss, float lr, float* norm) {
    plan_zero_grad(plan);
    MicroBatchSource batches = task_batches(task);
    float loss = plan->step.run(plan->step.ctx, model, &batches, grad_accum, dloss);
    *norm = plan_update(plan, lr);
    return task->step_loss(task, plan_mean(plan, loss));
}

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);   // line-buffered, also when piped into a log file
    TrainArgs args;
    parse_train_args(argc, argv, &args);
    train_paths_check(*die_rank_slot());   // every path by its role, before any work (llmc/train/outputs.h)
    if (args.plan) { return planner_main(&args); }   // --plan: predictions only, no step (llmc/planner/planner.h)
    Plan plan;
    plan_init(&plan, &argc, &argv, &args, planner_choose);   // MPI, the mesh (--mesh auto: the planner's), this rank's device, one voice
    Guard guard;
    guard_init(&guard, &args, &plan);        // failures: SIGXFSZ, --fault, the state's lock, the --comm-timeout watchdog (llmc/train/guard.h)

    // ---- the model, the batch, the task
    GPT2 model;
    train_state_model(&model, &args, plan_place, &plan);   // the shard of it this rank holds (--resume: the saved one)
    model.recompute = gpt2_recompute_parse(args.recompute);   // what the forward keeps per layer (before allocating)
    if (args.seq > model.config.max_seq_len) { die("--seq %d exceeds the model's maximum sequence length %d", args.seq, model.config.max_seq_len); }
    int B = plan_micro_batch(&plan), T = args.seq;
    gpt2_allocate_activations(&model, B, plan_local_seq(&plan, T));   // T/cp tokens per sequence with --cp
    plan_attach(&plan, &model);   // this rank's placement (data parallelism's hooks), the step
    Task task{};
    task_init(&task, &model, &plan, &args, B, T);

    // ---- what we are about to do
    plan_print(&plan);
    gpt2_print_shape(&model);   // its sizes (and the vocabulary's padding under --tp: llmc/model/gpt2_accounting.h)
    printf("batch        %d sequences x %d tokens = %d tokens per step (micro-batch %d, %d micro-steps)\n", args.batch, T,
           args.batch * T, B, args.grad_accum);
    task.describe(&task);
    plan_print_layout(&plan);   // memory table, mesh, communication
    if (args.trace) { plan_trace_start(&plan); }
    FILE* logf = NULL;
    std::string log_tmp;
    if (args.log && plan.rank == 0) { logf = fopen_tmp_for_write(args.log, &log_tmp); }
    task_open_metrics(&task);

    // ---- training
    Rng sample_rng;
    rng_init(&sample_rng, (uint64_t)args.seed + 1);
    LossScaler scaler;   // --loss-scale: the loss times S, the gradients divided by S in the update (llmc/train/loss_scale.h)
    loss_scale_init(&scaler, args.loss_scale, args.loss_scale_init, args.loss_scale_window);
    TrainState state;
    train_state_init(&state, &plan, &task, &args, &sample_rng, &scaler);   // --resume: step, optimizer, data, RNG, S, log
    if (logf) { fputs(state.log.c_str(), logf); }
    int stopped = 0;
    double flops_per_step = gpt2_flops_per_token(&model, T) * args.batch * T;
    double timed_seconds = 0.0;
    int timed_steps = 0;
    for (int step = state.first_step; step <= args.steps; step++) {
        int last = step == args.steps;
        int again = state.resumed && step == state.first_step && !last;   // done before the saved run stopped
        if (!again) { task_between_steps(&task, step, last, &sample_rng); }   // evaluation, samples, checkpoints
        if (train_state_due(&state, step)) { train_state_save(&state, step, &sample_rng); }
        if (args.exit_after > 0 && step == args.exit_after) {   // as a pre-empted job: no final evaluation or --save
            printf("stopping after step %d (--exit-after): continue with --resume %s\n", step, args.save_state);
            stopped = 1;
            break;
        }
        if (last) { break; }
        train_data_ahead(&state, step, &sample_rng);   // a bad shard the step would read: the state saved, every rank ends

        double t0 = wall_seconds();
        profile_step_begin(step > 0);   // --profile records every step but the first (llmc/profile.h)
        float dloss = guard_dloss(&guard, step, task.begin_step(&task, step));   // progress mark, --on-nan, --fault
        dloss = loss_scale_dloss(&scaler, &model, dloss);   // x S (1 without --loss-scale)
        plan_step_begin(&plan);   // the strategies' per-step statistics from zero (after RLVR's rollouts)
        float lr = lr_at_step(step, args.steps, args.lr, args.warmup, args.lr_final_frac), norm;
        float loss = train_step(&plan, &model, &task, args.grad_accum, dloss, lr, &norm);
        backend_synchronize();
        double dt = wall_seconds() - t0;
        profile_step_end(dt);
        int overflow = loss_scale_update(&scaler, step, norm);   // skipped for overflow: S halves
        guard_step_end(&guard, step, loss, norm, overflow);   // a non-finite loss or norm: stop naming the tensor, or skip (--on-nan)
        if (step > 0) { timed_seconds += dt; timed_steps++; }   // the first step warms caches up
        double peak = backend_peak_flops();
        char scale_note[64];
        print_step_line(step + 1, args.steps, loss, norm, lr, dt, (double)args.batch * task.micro[0].T,
                        peak > 0 ? 100.0 * flops_per_step / dt / (peak * plan.world_size) : -1.0,
                        loss_scale_describe(&scaler, scale_note, sizeof(scale_note)));
        if (plan.rank == 0) {   // the --log lines, kept also for the training state (a resumed run's --log has them all)
            char line[128];
            snprintf(line, sizeof(line), "%d %.9g %.9g %.9g\n", step + 1, loss, norm, lr);
            if (logf) { fputs(line, logf); }
            state.log += line;
        }
        task.report(&task, step, loss);
        plan_report_step(&plan, step);
    }

    // ---- the end
    if (timed_steps > 0) {   // the mean step (llmc/plan/log.h), the plan's communication (parallel_plan_report.h)
        print_average_step(timed_seconds, timed_steps, (double)args.batch * T, flops_per_step, backend_num_threads());
        plan_print_summary(&plan, timed_steps);
    }
    if (logf) { fclose_and_rename(logf, log_tmp, args.log); }
    task_free(&task);
    if (args.save && !stopped) {
        plan_full_model_begin(&plan);
        plan_save_checkpoint(&plan, args.save);
        printf("saved %s\n", args.save);
        plan_full_model_end(&plan);
    }
    if (args.trace) { plan_write_trace(&plan, args.trace); }
    gpt2_free(&model);
    guard_free(&guard);   // the watchdog (before MPI ends) and the state's lock
    plan_free(&plan);
    return 0;
}
