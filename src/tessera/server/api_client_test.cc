// What the client's fast paths ask of the API. GET /v1/jobs/N/wait: how `tessera run` follows a
// job - answered at once when the job's state or output already differ from what the client
// knows, else as soon as they do (a store commit wakes it; output is looked at every few
// milliseconds), else at its timeout. GET /v1/jobs?env=false: a listing without the stored
// environments (what `tessera ls` asks for a table).
#include <future>

#include "tessera/server/server_test_fixture.h"

namespace tessera::server::testing {
namespace {

TEST_F(ServerTest, AWaitAnswersOnceTheJobsStateOrOutputDiffersFromWhatTheClientKnows) {
  StartServer();
  const int64_t held = Submit(1, 10, 0, {{"hold", true}});
  const int64_t id = Submit(1, 10);
  Settle();
  ASSERT_EQ(State(id), "running");
  const std::string wait = "/v1/jobs/" + std::to_string(id) + "/wait";
  int status = 0;
  // Already different: at once.
  json w = Call("GET", wait + "?state=queued&bytes=0&timeout_s=30", nullptr, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(w, (json{{"state", "running"}, {"ended", false}, {"bytes", 0}, {"changed", true}}));
  // The same, and nothing happens: the timeout, said unchanged.
  w = Call("GET", "/v1/jobs/" + std::to_string(held) + "/wait?state=queued&bytes=0&timeout_s=0");
  EXPECT_EQ(w["changed"], false);
  EXPECT_EQ(w["state"], "queued");

  // Output written while it waits: answered with its size.
  auto waiting = std::async(std::launch::async, [&] {
    return Call("GET", wait + "?state=running&bytes=0&timeout_s=30");
  });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout)
      << "nothing changed yet";
  std::ofstream(config_.state_dir + "/logs/" + std::to_string(id) + ".err") << "12345";
  w = waiting.get();
  EXPECT_EQ(w["bytes"], 5);
  EXPECT_EQ(w["changed"], true);
  // The job ends while it waits: answered with its end.
  waiting = std::async(std::launch::async,
                       [&] { return Call("GET", wait + "?state=running&bytes=5&timeout_s=30"); });
  Advance(11);
  Settle();
  w = waiting.get();
  EXPECT_EQ(w["state"], "succeeded");
  EXPECT_EQ(w["ended"], true);

  // Refused: another user's job; bad parameters.
  Call("GET", wait + "?state=running", nullptr, &status, 65534);
  EXPECT_EQ(status, 403);
  for (const char* bad :
       {"?state=sleeping", "?bytes=-1", "?timeout_s=31", "?timeout_s=x", "?colour=red"}) {
    const json e = Call("GET", wait + bad, nullptr, &status);
    EXPECT_EQ(status, 400) << bad << " " << e.dump();
  }
  Call("GET", "/v1/jobs/999/wait", nullptr, &status);
  EXPECT_EQ(status, 404);
}

TEST_F(ServerTest, AListingWithoutEnvironmentsHasEverythingElse) {
  StartServer();
  const int64_t id = Submit(1, 10, 0, {{"env", {{"API_KEY", "s3cret"}}}, {"name", "quiet"}});
  Settle();
  const json full = Call("GET", "/v1/jobs");
  json brief = Call("GET", "/v1/jobs?env=false");
  ASSERT_EQ(full["jobs"].size(), 1u);
  EXPECT_EQ(full["jobs"][0]["spec"]["env"]["API_KEY"], "s3cret");
  EXPECT_FALSE(brief["jobs"][0]["spec"].contains("env"));
  brief["jobs"][0]["spec"]["env"] = full["jobs"][0]["spec"]["env"];
  EXPECT_EQ(brief, full) << "all else the same (the clock is the test's: no time moved)";
  EXPECT_EQ(Call("GET", "/v1/jobs?env=true")["jobs"][0]["spec"]["env"]["API_KEY"], "s3cret");
  int status = 0;
  Call("GET", "/v1/jobs?env=no", nullptr, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(Job(id)["spec"]["env"]["API_KEY"], "s3cret") << "one job's own page keeps it";
}

}  // namespace
}  // namespace tessera::server::testing
