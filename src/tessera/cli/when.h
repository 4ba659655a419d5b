#pragma once
// Times as users write them on the command line (`tessera acct --since`), sacct's habits included.

#include <optional>
#include <string>

namespace tessera::cli {

// "now"; "today" and "midnight" (today at 00:00), "yesterday" (yesterday at 00:00), "noon" (today
// at 12:00); a duration ago: "90m", "7d", "2w", "36h", "90s", and sacct's "now-7days",
// "now-2hours", "now-30minutes", "now-90seconds", "now-1weeks"; a date or a date and time in local
// time
// ("2026-11-01", "2026-11-01T08:00", "2026-11-01T08:00:30"); or seconds since the epoch. Seconds
// since the epoch; nullopt when it is none of these. `now` is the current time (seconds since the
// epoch).
std::optional<double> ParseWhen(const std::string& text, double now);

// What ParseWhen takes, as an error about a time that is none of it says: "...: expected " +
// kWhenForms.
inline constexpr char kWhenForms[] =
    "a duration ago (90m, 7d), today, yesterday, a date (2026-11-01), a date and time "
    "(2026-11-01T08:00) or seconds since the epoch";

}  // namespace tessera::cli
