// The command line of a pserver daemon: absl flags, with a --help that lists
// the binary's own flags.
//
// Abseil 20220623's --help lists only flags defined in a file named after the
// program (pserver_worker.cc), so for our main.cc files it prints "No flags
// matched", and it exits 1. ParseDaemonCommandLine prints the flags defined
// in the caller's file, with their defaults, and exits 0.
//
//   int main(int argc, char** argv) {
//     pserver::ParseDaemonCommandLine(
//         argc, argv, {"pserver_worker", "Trains a model ...", __FILE__});
//     return pserver::Run();
//   }
#ifndef PSERVER_COMMON_DAEMON_COMMAND_LINE_H_
#define PSERVER_COMMON_DAEMON_COMMAND_LINE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace pserver {

struct DaemonCommandLine {
  // Prefix of error lines, e.g. "pserver_worker".
  std::string program;
  // First lines of --help: what the binary does and a usage example.
  std::string usage;
  // __FILE__ of the file that defines the binary's ABSL_FLAGs: every flag
  // records the __FILE__ of its definition, so this picks exactly those.
  std::string flags_file;
  // Exit status for a positional argument (absl exits 1 on its own errors).
  int error_exit_code = 2;
};

// Parses argv into the flags; returns only if every argument is a known flag
// with a parsable value. Otherwise exits the process:
//  - 0 after --help, -help, --helpshort or -helpshort (before `--`): the
//    usage and every flag of spec.flags_file with its help and default, on
//    stdout;
//  - 1 on an unknown flag or an unparsable value, with absl's one line
//    "ERROR: ..." on stderr;
//  - spec.error_exit_code on a positional argument, with one line on stderr.
// --helpfull and --help=substring keep absl's meaning (all linked flags).
// REQUIRES: called once, before any flag is read.
void ParseDaemonCommandLine(int argc, char** argv,
                            const DaemonCommandLine& spec);

// The --help text: `usage`, then every flag defined in `flags_file`, sorted
// by name, one per line as "  --name (help); default: value;".
std::string DaemonHelpText(absl::string_view usage,
                           absl::string_view flags_file);

}  // namespace pserver

#endif  // PSERVER_COMMON_DAEMON_COMMAND_LINE_H_
