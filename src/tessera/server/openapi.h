#pragma once
// The OpenAPI 3 document of the server's API, served at /v1/openapi.json.
#include <string_view>

namespace tessera::server {
std::string_view OpenApiDocument();
}
