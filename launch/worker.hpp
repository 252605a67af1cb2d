// The per-rank wrapper, `thetad-launch --worker LOGDIR -- THETAD run ...`, started by mpirun or
// srun once per rank: it runs thetad, keeps its stderr in LOGDIR/rank-R.log and node-N.log and
// passes it rank-tagged to the launcher, turns any stop signal into one SIGTERM for thetad once
// thetad says its stop handler is installed, and records the rank's exit code in rank-R.exit.
#pragma once

namespace thetad::launch {

// argv[0] is the program, argv[1] "--worker". Returns the rank's exit code.
int worker_main(int argc, char** argv);

// `thetad-launch --exec-child PPID -- CMD...`: the first step of thetad's start, inside the
// child: dies with the wrapper (PR_SET_PDEATHSIG, SIGKILL), starts with SIGUSR1 ignored (mpirun
// forwards it to the whole process group; thetad installs its own handler for it), then execs.
int exec_child_main(int argc, char** argv);

// The environment variable naming the fd on which thetad reports its stop handler installed.
inline constexpr const char* kReadyFdVar = "THETAD_READY_FD";

}  // namespace thetad::launch
