#include "common/daemon/command_line.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"

namespace pserver {
namespace {

// absl reports a flag's file without leading slashes (its default
// normalize_filename); compare both sides that way, whichever is in force.
absl::string_view WithoutLeadingSlashes(absl::string_view file) {
  const size_t pos = file.find_first_not_of("/\\");
  return pos == absl::string_view::npos ? absl::string_view()
                                        : file.substr(pos);
}

bool SameFile(absl::string_view a, absl::string_view b) {
  return WithoutLeadingSlashes(a) == WithoutLeadingSlashes(b);
}

}  // namespace

std::string DaemonHelpText(absl::string_view usage,
                           absl::string_view flags_file) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (SameFile(flag->Filename(), flags_file)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(), [](const auto* a, const auto* b) {
    return a->Name() < b->Name();
  });
  std::string text = absl::StrCat(usage, "\n\nFlags:\n");
  for (const absl::CommandLineFlag* f : flags) {
    // Quoted, so an empty default shows as "" rather than nothing.
    std::string def = f->IsOfType<std::string>()
                          ? absl::StrCat("\"", f->DefaultValue(), "\"")
                          : f->DefaultValue();
    absl::StrAppend(&text, "  --", f->Name(), " (", f->Help(),
                    "); default: ", def, ";\n");
  }
  return text;
}

void ParseDaemonCommandLine(int argc, char** argv,
                            const DaemonCommandLine& spec) {
  absl::SetProgramUsageMessage(spec.usage);
  // absl's own --helpfull/--help=substring and the "did you mean" paths keep
  // working; --helpshort through absl would also pick the right file.
  const std::string file = spec.flags_file;
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [file](absl::string_view f) {
    return SameFile(f, file);
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-help" || arg == "--helpshort" ||
        arg == "-helpshort") {
      std::fputs(DaemonHelpText(spec.usage, spec.flags_file).c_str(), stdout);
      std::exit(0);
    }
  }
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr,
                 "%s: unexpected argument '%s'; expected only --flag=value\n",
                 spec.program.c_str(), rest[1]);
    std::exit(spec.error_exit_code);
  }
}

}  // namespace pserver
