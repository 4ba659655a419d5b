#pragma once
// The dashboard's files (web/, built by web/build.mjs), embedded in the binary at build time by
// cmake/EmbedWeb.cmake: the server needs no file, CDN or second process to serve them.

#include <span>
#include <string_view>

namespace tessera::server {

struct WebAsset {
  std::string_view name;          // "index.html", "app.js"
  std::string_view content_type;  // "text/html; charset=utf-8"
  std::string_view body;
};

std::span<const WebAsset> WebAssets();

}  // namespace tessera::server
