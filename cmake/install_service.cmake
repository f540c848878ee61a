# Run at install time (install(SCRIPT)): the systemd unit and the service's
# config, whose absolute paths depend on the prefix the install uses — /usr
# for the .deb (config in /etc), /usr/local by default (config in
# /usr/local/etc). FAIRGATE_SOURCE_DIR is set by the install(CODE) before.
set(prefix "${CMAKE_INSTALL_PREFIX}")
if(prefix STREQUAL "/usr")
  set(etc "/etc")
else()
  set(etc "${prefix}/etc")
endif()
set(FAIRGATE_BINARY "${prefix}/bin/fairgate")
set(FAIRGATE_CONFIG "${etc}/fairgate/fairgate.toml")
set(FAIRGATE_DOCDIR "${prefix}/share/doc/fairgate")
set(unit "${FAIRGATE_BINARY_DIR}/packaging/fairgate.service")
configure_file("${FAIRGATE_SOURCE_DIR}/packaging/fairgate.service.in" "${unit}" @ONLY)
# file(INSTALL) honours DESTDIR (the staging directory of cpack).
file(INSTALL "${unit}" DESTINATION "${prefix}/lib/systemd/system"
     PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
# An administrator's config is never overwritten by a later install.
if(EXISTS "$ENV{DESTDIR}${FAIRGATE_CONFIG}")
  message(STATUS "Keeping: $ENV{DESTDIR}${FAIRGATE_CONFIG} (the example is in ${FAIRGATE_DOCDIR}/examples/config)")
else()
  file(INSTALL "${FAIRGATE_SOURCE_DIR}/packaging/fairgate.toml" DESTINATION "${etc}/fairgate"
       PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
endif()
