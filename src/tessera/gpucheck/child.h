#pragma once
// A tenant process of tessera-gpu-check's scenarios: started with its own argv and environment,
// its stdout read line by line (with a deadline; past it the tenant is killed) and its stdin
// written (the memory tenant takes commands); reaped when destroyed.

#include <sys/types.h>

#include <string>
#include <vector>

namespace tessera::gpucheck {

// A tenant process: its stdout (and stdin for the memory tenant) through pipes.
class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { Wait(); }

  bool Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
             std::string* err);
  // The next line of output; "" at its end or after `timeout_ms` (then the tenant is killed).
  std::string ReadLine(int timeout_ms = 120000);
  void Send(const std::string& line);
  int Wait();
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1, in_ = -1;
  int status_ = 0;
  std::string buffer_;
};

}  // namespace tessera::gpucheck
