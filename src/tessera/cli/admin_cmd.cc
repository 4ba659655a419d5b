#include "tessera/cli/admin_cmd.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "fmt/format.h"
#include "tessera/cli/app.h"
#include "tessera/cli/remote.h"
#include "tessera/cli/version.h"
#include "tessera/core/gpu.h"
#include "tessera/server/backup.h"
#include "tessera/server/server.h"

namespace tessera::cli {
namespace {

struct AdminState {
  std::string config, user, state_dir, file, shell = "bash";
  bool admin = false;
  std::string purge_jobs, purge_logs, purge_env;  // ages as written: 30d, 12h, 0
  remote::ClientFlags client;
};

std::string UserName() {
  const passwd* pw = getpwuid(geteuid());
  return pw != nullptr ? pw->pw_name : std::to_string(geteuid());
}

std::string StateDir(const AdminState& s) {
  return s.state_dir.empty() ? server::DefaultServerConfig().state_dir : s.state_dir;
}

void Describe(const server::BackupInfo& info, std::ostream& out) {
  out << fmt::format("{} jobs, schema version {}, {}", info.jobs, info.schema_version,
                     core::FormatBytes(info.bytes));
}

// Every subcommand under `app`, with its path ("submit", "sim replay").
void Walk(const CLI::App& app, const std::string& path,
          std::vector<std::pair<std::string, const CLI::App*>>* all) {
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    const std::string p = path.empty() ? sub->get_name() : path + " " + sub->get_name();
    all->push_back({p, sub});
    Walk(*sub, p, all);
  }
}

std::vector<std::string> OptionNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options([](const CLI::Option*) { return true; })) {
    if (o->get_positional()) continue;
    for (const std::string& s : o->get_snames()) names.push_back("-" + s);
    for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
  }
  return names;
}

// roff: a leading dot or quote would be a request; backslashes and hyphens are escaped.
std::string Roff(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\e";
    } else if (c == '-') {
      out += "\\-";
    } else {
      out += c;
    }
  }
  if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out = "\\&" + out;
  return out;
}

}  // namespace

std::string BashCompletion(const CLI::App& app) {
  std::vector<std::pair<std::string, const CLI::App*>> all;
  Walk(app, "", &all);
  std::ostringstream o;
  o << "# bash completion for tessera: made by `tessera completion bash` from the command line's "
       "own\n"
       "# definitions. Install as /usr/share/bash-completion/completions/tessera.\n"
       "_tessera() {\n"
       "  local cur prev path=\"\" w i\n"
       "  cur=${COMP_WORDS[COMP_CWORD]}\n"
       "  prev=${COMP_WORDS[COMP_CWORD-1]}\n"
       "  # The subcommands named so far, up to the first -- (a job's own command follows).\n"
       "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
       "    w=${COMP_WORDS[i]}\n"
       "    [[ $w == -- ]] && { COMPREPLY=($(compgen -c -- \"$cur\")); return; }\n"
       "    case \"$path $w\" in\n";
  std::set<std::string> paths;
  for (const auto& [p, sub] : all) paths.insert(p);
  for (const std::string& p : paths) o << "      \" " << p << "\") path=\"" << p << "\" ;;\n";
  o << "    esac\n"
       "  done\n"
       "  case \"$prev\" in\n"
       "    -o|--output) COMPREPLY=($(compgen -W \"table json yaml\" -- \"$cur\")); return ;;\n"
       "    --socket|--config|-c|--state-dir|--stdout|--stderr|--workdir|--ca-cert|--simulate)\n"
       "      COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
       "  esac\n"
       "  local words\n"
       "  case \"$path\" in\n";
  auto line = [&](const std::string& p, const CLI::App& a) {
    std::vector<std::string> words = OptionNames(a);
    for (const CLI::App* sub : a.get_subcommands([](const CLI::App*) { return true; }))
      words.push_back(sub->get_name());
    o << "    \"" << p << "\") words=\"" << fmt::format("{}", fmt::join(words, " ")) << "\" ;;\n";
  };
  line("", app);
  for (const auto& [p, sub] : all) line(p, *sub);
  o << "  esac\n"
       "  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n"
       "  # A batch script or a file where no option or subcommand matches.\n"
       "  [[ ${#COMPREPLY[@]} -eq 0 && $cur != -* ]] && COMPREPLY=($(compgen -f -- \"$cur\"))\n"
       "}\n"
       "complete -F _tessera tessera\n";
  return o.str();
}

std::string ManPage(const CLI::App& app, const std::string& version) {
  std::vector<std::pair<std::string, const CLI::App*>> all;
  Walk(app, "", &all);
  std::ostringstream o;
  o << ".\\\" Made by `tessera man` from the command line's own definitions.\n"
    << ".TH TESSERA 1 \"\" \"tessera " << Roff(version) << "\" \"User Commands\"\n"
    << ".SH NAME\ntessera \\- " << Roff(app.get_description()) << "\n"
    << ".SH SYNOPSIS\n.B tessera\n[\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]\n.br\n"
       ".B tessera\n\\fICOMMAND\\fR \\fB\\-\\-help\\fR\n"
    << ".SH DESCRIPTION\n"
       "Tessera shares a machine's GPUs between users and jobs: whole GPUs placed by topology, and "
       "fractions of one (memory and compute) enforced inside the job. Users submit with "
       "\\fBtessera submit\\fR or \\fBtessera run\\fR (Slurm's \\fB\\-\\-time\\fR, "
       "\\fB\\-J\\fR, \\fB\\-\\-gres\\fR and #SBATCH lines are understood) to the server "
       "(\\fBtessera server\\fR, usually the systemd service \\fBtessera.service\\fR).\n"
       ".PP\nThe client talks to \\fB$TESSERA_SOCKET\\fR when set, else to the user's own server "
       "when one listens at its default socket, else to the system server at "
    << Roff(server::kSystemSocket) << ".\n";
  auto options = [&](const CLI::App& a) {
    for (const CLI::Option* opt : a.get_options([](const CLI::Option*) { return true; })) {
      if (opt->get_lnames().empty() && opt->get_snames().empty() && !opt->get_positional())
        continue;
      // -h, --help: said once, for every command, in the synopsis.
      if (opt->get_name() == "--help" || opt->get_name() == "-h,--help") continue;
      std::vector<std::string> names;
      for (const std::string& s : opt->get_snames()) names.push_back("\\-" + Roff(s));
      for (const std::string& l : opt->get_lnames()) names.push_back("\\-\\-" + Roff(l));
      std::string head = opt->get_positional()
                             ? "\\fI" + Roff(opt->get_name()) + "\\fR"
                             : "\\fB" + fmt::format("{}", fmt::join(names, ", ")) + "\\fR";
      if (!opt->get_positional() && !opt->get_type_name().empty())
        head += " \\fI" + Roff(opt->get_type_name()) + "\\fR";
      o << ".TP\n" << head << "\n" << Roff(opt->get_description()) << "\n";
    }
  };
  o << ".SH OPTIONS\n";
  options(app);
  o << ".SH COMMANDS\n";
  for (const auto& [p, sub] : all) {
    o << ".SS \"tessera " << Roff(p) << "\"\n" << Roff(sub->get_description()) << "\n";
    options(*sub);
  }
  o << ".SH ENVIRONMENT\n"
       ".TP\n\\fBTESSERA_SOCKET\\fR\nThe server: a unix socket, https://host:port or "
       "tcp://host:port.\n"
       ".TP\n\\fBTESSERA_TOKEN\\fR\nBearer token for a TCP server.\n"
       ".TP\n\\fBTESSERA_LOG\\fR\nLog level (as \\-\\-log\\-level).\n"
       ".SH EXIT STATUS\n0 success; 1 the operation failed; 2 bad usage or input. \\fBtessera "
       "run\\fR exits with its job's code (127: the command was not found).\n"
       ".SH FILES\n"
       ".TP\n/etc/tessera/server.yaml\nThe installed server's config.\n"
       ".TP\n/var/lib/tessera\nIts state: the job database, logs, shared regions.\n"
       ".SH SEE ALSO\n\\fBsbatch\\fR(1), \\fBsrun\\fR(1); docs/server.md in the source.\n";
  return o.str();
}

std::shared_ptr<void> AddAdminCommands(CLI::App& app, std::function<int()>& action,
                                       std::ostream& out, std::ostream& err) {
  auto st = std::make_shared<AdminState>();
  AdminState& s = *st;
  CLI::App* admin =
      app.add_subcommand("admin", "A server's upkeep: API tokens, backup and restore, purge");
  admin->require_subcommand(1);

  CLI::App* token = admin->add_subcommand(
      "token",
      "Print USER's token in the server config's tcp.tokens, adding a new random one (and "
      "making the file, 0600) when there is none; edits through the YAML library, the file as it "
      "was kept as FILE.bak");
  token->add_option("-c,--config", s.config, "The server's config file")->required();
  token->add_option("--user", s.user, "The token's local account (default: you)");
  token->add_flag("--admin", s.admin, "An admin's token (may act on every user's jobs)");
  token->callback([&, st] {
    action = [&, st] {
      bool added = false;
      const std::string user = s.user.empty() ? UserName() : s.user;
      auto t = server::EnsureToken(s.config, user, s.admin, &added);
      if (!t.ok()) {
        err << "tessera: " << t.status().message() << "\n";
        return t.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput
                                                                       : kExitFailure;
      }
      if (added) err << "tessera: added a token for " << user << " to " << s.config << "\n";
      out << *t << "\n";
      return kExitOk;
    };
  });

  CLI::App* backup = admin->add_subcommand(
      "backup",
      "Copy the server's job database to FILE while it runs (one consistent moment; the file "
      "made 0600, checked)");
  backup->add_option("file", s.file, "The backup to make (a new file)")->required();
  backup->add_option(
      "--state-dir", s.state_dir,
      "The server's state folder (default " + server::DefaultServerConfig().state_dir + ")");
  backup->callback([&, st] {
    action = [&, st] {
      auto info = server::BackupStore(StateDir(s) + "/tessera.db", s.file);
      if (!info.ok()) {
        err << "tessera: backup: " << info.status().message() << "\n";
        return info.status().code() == absl::StatusCode::kAlreadyExists ? kExitBadInput
                                                                        : kExitFailure;
      }
      out << "backed up " << StateDir(s) << "/tessera.db to " << s.file << ": ";
      Describe(*info, out);
      out << "\n";
      return kExitOk;
    };
  });

  CLI::App* restore = admin->add_subcommand(
      "restore",
      "Put a backup in place of the server's job database (the server stopped; the database "
      "replaced is kept beside it)");
  restore->add_option("file", s.file, "A backup made by tessera admin backup")->required();
  restore->add_option(
      "--state-dir", s.state_dir,
      "The server's state folder (default " + server::DefaultServerConfig().state_dir + ")");
  restore->callback([&, st] {
    action = [&, st] {
      std::string aside;
      auto info = server::RestoreStore(s.file, StateDir(s), &aside);
      if (!info.ok()) {
        err << "tessera: restore: " << info.status().message() << "\n";
        return info.status().code() == absl::StatusCode::kFailedPrecondition ? kExitFailure
                                                                             : kExitBadInput;
      }
      out << "restored " << s.file << " to " << StateDir(s) << "/tessera.db: ";
      Describe(*info, out);
      out << (aside.empty() ? std::string() : "; the database it replaced is " + aside) << "\n";
      return kExitOk;
    };
  });

  CLI::App* purge = admin->add_subcommand(
      "purge",
      "Remove now, from the running server, what its retention: would in time: the jobs that "
      "ended over an age ago (with their logs), or only their logs, or only their stored "
      "environments (an admin's right; jobs a waiting job's --after names stay)");
  purge->add_option("--jobs", s.purge_jobs,
                    "Jobs that ended over this long ago, with their logs and events (30d, 12h; 0: "
                    "every ended job)");
  purge->add_option("--logs", s.purge_logs, "The logs of jobs that ended over this long ago");
  purge->add_option("--environments", s.purge_env,
                    "The stored environments (variables, API keys...) of jobs that ended over "
                    "this long ago");
  s.client.AddTo(purge);
  purge->callback([&, st] {
    action = [&, st] {
      remote::json body = remote::json::object();
      for (auto [key, flag, text] : {std::tuple{"jobs_s", "--jobs", &s.purge_jobs},
                                     {"logs_s", "--logs", &s.purge_logs},
                                     {"environments_s", "--environments", &s.purge_env}}) {
        if (text->empty()) continue;
        const std::optional<double> age = core::ParseDurationOrZero(*text);
        if (!age) {
          err << fmt::format("tessera: {} {}: expected an age such as 30d, 12h or 0\n", flag,
                             *text);
          return kExitBadInput;
        }
        body[key] = *age;
      }
      if (body.empty()) {
        err << "tessera: admin purge: name what to remove: --jobs AGE, --logs AGE or "
               "--environments AGE\n";
        return kExitBadInput;
      }
      net::HttpClient c = s.client.Client();
      int code = kExitOk;
      auto done = remote::Call(c, "POST", "/v1/admin/purge", body.dump(), err, &code);
      if (!done) return code;
      if (s.client.output != "table") {
        remote::Emit(*done, s.client.output, out);
        return kExitOk;
      }
      auto jobs = [&](const char* key) {
        const int64_t n = (*done)[key].get<int64_t>();
        return fmt::format("{} job{}", n, n == 1 ? "" : "s");
      };
      std::vector<std::string> parts;
      if (body.contains("jobs_s")) parts.push_back(jobs("jobs") + " (with their logs)");
      if (body.contains("logs_s")) parts.push_back("the logs of " + jobs("logs"));
      if (body.contains("environments_s"))
        parts.push_back("the stored environments of " + jobs("environments"));
      out << fmt::format("purged {}\n", fmt::join(parts, "; "));
      return kExitOk;
    };
  });

  CLI::App* completion =
      app.add_subcommand("completion",
                         "Print a shell completion script: tessera completion bash > "
                         "/usr/share/bash-completion/completions/tessera");
  completion->add_option("shell", s.shell, "The shell (bash)")->check(CLI::IsMember({"bash"}));
  completion->callback([&, st] {
    action = [&, st] {
      out << BashCompletion(app);
      return kExitOk;
    };
  });
  CLI::App* man = app.add_subcommand("man", "Print the man page (roff): tessera man | man -l -");
  man->callback([&, st] {
    action = [&, st] {
      out << ManPage(app, kVersion);
      return kExitOk;
    };
  });
  return st;
}

}  // namespace tessera::cli
