// A clean stop on request: install_stop_handlers() makes SIGINT, SIGTERM, SIGUSR1 and SIGUSR2 set
// a process-wide flag instead of killing the process. A training loop polls stop_requested() at
// the end of each step and all-reduces it (max) over the ranks, so every rank stops after the same
// step, writes its checkpoint and exits 0 even when only some ranks received the signal. A second
// signal of the same kind ends the process at once (the handler is reset to the default after
// the first delivery), so an impatient user is never ignored.
//
// Under mpirun, signal mpirun with SIGUSR1 (it forwards it to every rank and exits with the
// ranks' status, 0); SIGINT/SIGTERM sent to mpirun reach the ranks as SIGTERM but mpirun kills
// them odls_base_sigkill_timeout seconds later and exits 1; no rank outlives mpirun
// (core/launcher.h). docs/training-signals.md has the measurements and the recommended commands.
#pragma once

namespace upipe {

// Blocks the stop signals in the calling thread (and the threads it starts later): called first
// in main, so a stop requested while MPI_Init runs (0.3 s) waits for the handlers instead of
// killing the rank. release_stop_signals() unblocks them (a command that does not stop cleanly
// then gets the default action, a pending signal included).
void hold_stop_signals();
void release_stop_signals();

// Installs the handlers, then releases the signals. Only programs that poll stop_requested()
// should call it: elsewhere Ctrl-C would be ignored. Safe to call more than once.
void install_stop_handlers();
// True once one of the signals above arrived (async-signal-safe to read).
bool stop_requested();
// The signal that requested the stop; 0 when none did.
int stop_signal();
// Forgets a request (tests).
void clear_stop_request();

}  // namespace upipe
