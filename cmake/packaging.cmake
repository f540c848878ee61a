# Install rules and the Debian package (CPack), included from the top-level
# CMakeLists.txt. docs/packaging.md says what the package holds and how it is
# checked (tests/package/deb_test.sh).
#
#   cmake --build build/test && (cd build/test && cpack -G DEB)   → fairgate_VERSION_ARCH.deb
#   cmake --install build/test --prefix /usr/local                 → the same files, by hand
include(GNUInstallDirs)
# `cpack` and `cmake --install` package what is built; they never start a build
# (the package test runs cpack while other tests run).
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)

# --- the man page, generated from --help (help2man, a Debian package) ----------
find_program(FAIRGATE_HELP2MAN help2man)
if(FAIRGATE_HELP2MAN)
  set(man_dir ${PROJECT_BINARY_DIR}/man)
  add_custom_command(
    OUTPUT ${man_dir}/fairgate.1.gz
    COMMAND ${CMAKE_COMMAND} -E make_directory ${man_dir}
    COMMAND ${CMAKE_COMMAND} -DFAIRGATE=$<TARGET_FILE:fairgate_cli> -DHELP2MAN=${FAIRGATE_HELP2MAN}
            -DOUT=${man_dir}/fairgate.1 -DINCLUDE=${PROJECT_SOURCE_DIR}/packaging/man.h2m
            -P ${PROJECT_SOURCE_DIR}/cmake/man_page.cmake
    COMMAND gzip -9nf ${man_dir}/fairgate.1
    DEPENDS fairgate_cli ${PROJECT_SOURCE_DIR}/cmake/man_page.cmake ${PROJECT_SOURCE_DIR}/packaging/man.h2m
    COMMENT "Generating the man page fairgate.1 from --help" VERBATIM)
  add_custom_target(fairgate_man ALL DEPENDS ${man_dir}/fairgate.1.gz)
  install(FILES ${man_dir}/fairgate.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
else()
  message(WARNING "help2man not found (apt install help2man): the package will have no man page")
endif()

# --- what is installed ----------------------------------------------------------
install(TARGETS fairgate_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(CODE "set(FAIRGATE_SOURCE_DIR \"${PROJECT_SOURCE_DIR}\")\nset(FAIRGATE_BINARY_DIR \"${PROJECT_BINARY_DIR}\")")
install(SCRIPT ${PROJECT_SOURCE_DIR}/cmake/install_service.cmake)
set(doc ${CMAKE_INSTALL_DATAROOTDIR}/doc/fairgate)
install(FILES README.md CHANGELOG.md LICENSE NOTICE packaging/copyright DESTINATION ${doc})
install(FILES docs/serve.md docs/gateway.md docs/api.md docs/clients.md docs/design.md docs/packaging.md
              docs/openapi.yaml
        DESTINATION ${doc})
install(DIRECTORY examples/config DESTINATION ${doc}/examples FILES_MATCHING PATTERN "*.toml" PATTERN "*.md")

# --- the Debian package -----------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME fairgate)
set(CPACK_PACKAGE_VENDOR "the fairgate authors")
set(CPACK_PACKAGE_CONTACT "fairgate maintainers <fairgate@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "fair, cluster-wide concurrency limiter and admission server")
set(CPACK_PACKAGE_DESCRIPTION
    "fairgate puts one global concurrency cap with a fair FIFO queue in front of long-running requests (LLM and RAG streaming answers, exports, uploads) across every instance of a service, sharing the state through Redis. `fairgate serve` is an HTTP admission API (hold an SSE stream = hold a permit) and an OpenAI-compatible gateway in front of model servers. This package ships the server, a systemd unit running it as an unprivileged dynamic user, an example config in /etc/fairgate, the man page and the documentation.")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
# cpack installs with CMAKE_INSTALL_PREFIX=/usr into a staging DESTDIR, so the
# unit and the config get their Debian paths (/usr/bin, /etc/fairgate).
set(CPACK_SET_DESTDIR ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)  # Depends: from the shared libraries the binary links (dpkg-shlibdeps)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/packaging/debian/conffiles ${PROJECT_SOURCE_DIR}/packaging/debian/postinst
    ${PROJECT_SOURCE_DIR}/packaging/debian/prerm ${PROJECT_SOURCE_DIR}/packaging/debian/postrm)
set(CPACK_PACKAGE_FILE_NAME fairgate)  # overridden by DEB-DEFAULT: fairgate_VERSION_ARCH.deb
include(CPack)
