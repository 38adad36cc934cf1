// A rank and the launcher that started it (mpirun on its host, OpenMPI's orted on the others).
// Two promises depend on it:
//   - no rank outlives the launcher: once mpirun has returned no rank runs, so none writes
//     anything (a second Ctrl-C makes mpirun return at once, while its ranks may be writing a
//     checkpoint): end_with_launcher();
//   - a rank that ends the job (its watchdog fired, or it failed alone) makes sure the job does
//     end: mpirun's abort waits for the daemon of every host, forever when a host has dropped off
//     the network, so the rank leaves a guard that ends its launcher if the launcher is still
//     there kLauncherGraceSeconds later: guard_launcher().
// Both act only under an OpenMPI launcher (OMPI_COMM_WORLD_SIZE set); elsewhere the parent is a
// shell that may legitimately exit first and must never be signalled.
#pragma once

namespace upipe {

// mpirun's normal abort takes about 2 s (2T - 2 s with odls_base_sigkill_timeout = T, <= 10).
inline constexpr int kLauncherGraceSeconds = 20;
// After a normal end: mpirun exits within a second or two once its ranks have; a loaded machine
// (many ranks under a sanitizer) is given much longer.
inline constexpr int kLauncherEndGraceSeconds = 60;

// Makes the kernel end this process with SIGKILL the moment its parent exits, and ends it at once
// when the parent is already gone. Call first thing, before MPI_Init.
void end_with_launcher();

// Whether end_with_launcher found this process started by an OpenMPI launcher (its output then
// goes to the launcher, shared with no shell).
bool started_by_launcher();

// Forks a detached guard (async-signal-safe calls only, so any thread may call it just before
// the process ends): if the launcher still runs grace_s seconds later, the guard prints why on
// the launcher's stderr and kills it (SIGKILL: mpirun exits 137); it exits as soon as the
// launcher is gone.
void guard_launcher(int grace_s = kLauncherGraceSeconds);

// After a normal end: mpirun waits for every host's daemon even after all ranks ended, forever
// for a host gone, so the guard above with kLauncherEndGraceSeconds, but only where the parent
// is OpenMPI's launcher or daemon itself (mpirun, mpiexec, orterun, prterun, orted, prted): a
// wrapper between them (a profiler writing its report, a script going on after upipe) is left.
void guard_launcher_after_end();

}  // namespace upipe
