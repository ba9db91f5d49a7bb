# lease_man.cmake - whether the man pages are built, and where: read by
# docs/man/CMakeLists.txt (which builds them) and by tests/docs (which tests
# them), in whichever order the two directories are added.
#
# LEASE_MAN=AUTO builds the pages when scdoc is found, ON requires it (what
# scripts/test.sh and packaging use, so that a missing tool cannot silently
# drop the pages), OFF never builds them. Sets LEASE_MAN_BUILT (TRUE/FALSE),
# SCDOC, LEASE_MAN_DIR and LEASE_MAN_PAGES (the pages' paths) in the scope
# that includes it; says what it decided once per configure.

set(LEASE_MAN AUTO CACHE STRING "Build the man pages with scdoc: AUTO, ON or OFF")
set_property(CACHE LEASE_MAN PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${LEASE_MAN}" _lease_man_mode)
if(NOT _lease_man_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "LEASE_MAN must be AUTO, ON or OFF, not '${LEASE_MAN}'")
endif()

set(LEASE_MAN_BUILT FALSE)
set(_lease_man_note "off (LEASE_MAN=OFF)")
if(NOT _lease_man_mode STREQUAL "OFF")
  find_program(SCDOC scdoc)
  if(SCDOC)
    set(LEASE_MAN_BUILT TRUE)
    set(_lease_man_note "on (${SCDOC})")
  elseif(_lease_man_mode STREQUAL "ON")
    message(FATAL_ERROR "LEASE_MAN=ON but scdoc was not found: install the "
      "Debian package scdoc (apt-get install scdoc), or configure with "
      "-DLEASE_MAN=AUTO or OFF")
  else()
    set(_lease_man_note "off (install scdoc to build them)")
  endif()
endif()
get_property(_lease_man_said GLOBAL PROPERTY LEASE_MAN_SAID)
if(NOT _lease_man_said)
  set_property(GLOBAL PROPERTY LEASE_MAN_SAID TRUE)
  message(STATUS "man pages: ${_lease_man_note}")
endif()

set(LEASE_MAN_DIR ${PROJECT_BINARY_DIR}/docs/man)
set(LEASE_MAN_NAMES lease.1 liblease.3 lease-stores.7)
set(LEASE_MAN_PAGES)
foreach(_page ${LEASE_MAN_NAMES})
  list(APPEND LEASE_MAN_PAGES ${LEASE_MAN_DIR}/${_page})
endforeach()
