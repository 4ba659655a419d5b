# What `cmake --install` (and scripts/install) puts on a machine: the binaries, the intercept
# library in a folder of its own (found by the server as ../lib/tessera/ from its binary), the
# SPANK plugin, the systemd unit, the man page and bash completion (made by the built binary from
# its own command line), and the example config under share/ (scripts/install copies it to /etc
# only when there is none), with the Grafana dashboards and Prometheus alerting rules to load.
include(GNUInstallDirs)
set(TESSERA_INSTALL_BINDIR ${CMAKE_INSTALL_FULL_BINDIR})
configure_file(${CMAKE_SOURCE_DIR}/deploy/systemd/tessera.service.in
               ${CMAKE_BINARY_DIR}/deploy/tessera.service @ONLY)
add_custom_command(
  OUTPUT ${CMAKE_BINARY_DIR}/share/tessera.1 ${CMAKE_BINARY_DIR}/share/tessera.bash
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/share
  COMMAND $<TARGET_FILE:tessera> man > ${CMAKE_BINARY_DIR}/share/tessera.1
  COMMAND $<TARGET_FILE:tessera> completion bash > ${CMAKE_BINARY_DIR}/share/tessera.bash
  DEPENDS tessera tessera-full
  COMMENT "Man page and bash completion from tessera's own command line")
add_custom_target(tessera_docs_generated ALL
  DEPENDS ${CMAKE_BINARY_DIR}/share/tessera.1 ${CMAKE_BINARY_DIR}/share/tessera.bash)

install(TARGETS tessera RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The whole program, which `tessera` execs for every command but the client's (cli/client_main.cc).
install(TARGETS tessera-full RUNTIME DESTINATION lib/tessera)
install(TARGETS tessera-gpu-check RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} OPTIONAL)
install(TARGETS tessera-cuda LIBRARY DESTINATION lib/tessera)
if(TARGET tessera-spank)
  install(TARGETS tessera-spank LIBRARY DESTINATION lib/tessera)
endif()
install(FILES ${CMAKE_BINARY_DIR}/deploy/tessera.service DESTINATION lib/systemd/system)
if(TARGET tessera-spank)
  install(FILES ${CMAKE_SOURCE_DIR}/deploy/systemd/tessera-slurm-mps@.service
          DESTINATION lib/systemd/system)
endif()
install(FILES ${CMAKE_BINARY_DIR}/share/tessera.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${CMAKE_BINARY_DIR}/share/tessera.bash
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME tessera)
install(FILES ${CMAKE_SOURCE_DIR}/deploy/systemd/server.yaml
        DESTINATION ${CMAKE_INSTALL_DATADIR}/tessera)
install(FILES ${CMAKE_SOURCE_DIR}/deploy/grafana/tessera-server.json
              ${CMAKE_SOURCE_DIR}/deploy/grafana/tessera-slurm.json
              ${CMAKE_SOURCE_DIR}/deploy/grafana/tessera.json
        DESTINATION ${CMAKE_INSTALL_DATADIR}/tessera/grafana)
install(FILES ${CMAKE_SOURCE_DIR}/deploy/prometheus/tessera-rules.yaml
        DESTINATION ${CMAKE_INSTALL_DATADIR}/tessera/prometheus)
