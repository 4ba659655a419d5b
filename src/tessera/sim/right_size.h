#pragma once
// Right-sizing (issue 58, docs/simulator.md "Requests as asked and right-sized"): what a trace's
// jobs would ask if each asked for what it uses. Two steps, both pure and seeded:
// - a use model, for traces that do not say how busy each job kept its GPUs (openb, a sacct export
//   without TRESUsage): each GPU job's utilization of what it was given, in percent of its GPUs'
//   time, drawn from a Beta distribution of a stated mean and concentration, one draw per job from
//   the seed and the job's id (the same job gets the same draw in every run and order). A job whose
//   trace says its utilization keeps it;
// - right-sized requests: a job on one GPU or a share of one asks for its use plus a margin,
//   rounded up to a granularity of the GPU (at least one granule, at most the whole GPU); a job of
//   several whole GPUs keeps its count (its ranks are a property of the program, not a size to
//   shrink), as do jobs without GPUs. What a job does is unchanged: its utilization in percent of
//   the GPU's time and its duration stay, so the replay's busy figure is the same work on fewer
//   allocated GPUs. Run time lost to sharing is the replay's interference model's (--interference),
//   not this step's.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "tessera/sim/trace.h"

namespace tessera::sim {

struct UseModel {
  // The mean utilization of what a job was given (0..1) and the Beta distribution's concentration
  // (a + b: higher is narrower). Defaults: a mean of 0.5 and a concentration of 2, a wide spread
  // (docs/simulator.md says where these come from).
  double mean = 0.5;
  double concentration = 2;
  uint64_t seed = 1;
};
// kInvalidArgument naming the field: a mean outside (0, 1), a concentration not above 0.
absl::Status CheckUseModel(const UseModel& m);
// Sets each GPU job's utilization where the trace gave none (< 0): the drawn share of what it asked
// (a share of 300 milli that uses half of it: 15% of the GPU's time). Returns how many were drawn.
size_t ApplyUseModel(std::vector<SimJob>& jobs, const UseModel& m);

struct RightSizing {
  double margin = 0.2;              // asked = use x (1 + margin)
  int32_t granularity_milli = 100;  // requests rounded up to this part of a GPU
};
// kInvalidArgument naming the field: a negative margin, a granularity outside 1..1000.
absl::Status CheckRightSizing(const RightSizing& r);
// The jobs as they would ask when right-sized (see above). Jobs without a known utilization are
// left as asked.
std::vector<SimJob> RightSize(const std::vector<SimJob>& jobs, const RightSizing& r);

}  // namespace tessera::sim
