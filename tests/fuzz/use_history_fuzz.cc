// libFuzzer target: the extender's use history ConfigMap (`history.json`, written by the extender,
// editable by whoever may edit ConfigMaps in its namespace) on arbitrary bytes: whatever it holds
// is read record by record - a record it cannot use is skipped and counted, never a crash - and
// what was read is written back within a ConfigMap's size, as an array of the records it kept.
#include <cstddef>
#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"
#include "tessera/core/clock.h"
#include "tessera/extender/extender.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tessera::core::FakeClock clock;
  tessera::extender::Extender ex({}, clock);
  const nlohmann::json records =
      nlohmann::json::parse(reinterpret_cast<const char*>(data),
                            reinterpret_cast<const char*>(data) + size, nullptr, false);
  const int bad = ex.LoadUseHistory(records);
  if (bad < 0) __builtin_trap();
  if (!records.is_array() && bad != 1) __builtin_trap();
  if (records.is_array() && static_cast<size_t>(bad) > records.size()) __builtin_trap();
  // Nothing learned since: nothing to write.
  if (ex.TakeUseHistory()) __builtin_trap();
  return 0;
}
