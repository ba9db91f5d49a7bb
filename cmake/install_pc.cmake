# Run by `cmake --install`: writes lease.pc for the prefix of this install,
# which may differ from the one configured (--prefix), straight into the
# destination, so that two installs of one build at once never share a
# file. pkg-config splits its output on spaces, so a space in the prefix
# is escaped with "\". DESTDIR (packaging) is not part of the prefix.
# In: LEASE_PC_IN (lease.pc.in as configured), LEASE_PC_LIBDIR_INSTALL.
string(REPLACE " " "\\ " LEASE_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
if(IS_ABSOLUTE "${LEASE_PC_LIBDIR_INSTALL}")
  set(_pcdir "$ENV{DESTDIR}${LEASE_PC_LIBDIR_INSTALL}/pkgconfig")
else()
  set(_pcdir "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/${LEASE_PC_LIBDIR_INSTALL}/pkgconfig")
endif()
message(STATUS "Installing: ${_pcdir}/lease.pc")
configure_file("${LEASE_PC_IN}" "${_pcdir}/lease.pc" @ONLY)
list(APPEND CMAKE_INSTALL_MANIFEST_FILES "${_pcdir}/lease.pc")
