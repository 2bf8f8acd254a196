# ldconfig.cmake: run by `make install` (cmake --install) after the libraries are in place. Where
# the library folder is one the loader searches (/usr/local/lib on Debian), the loader's cache is
# renewed, so that programs find libcddp.so.0 at once; elsewhere, what to do is said. Nothing is
# done for a staged install (DESTDIR: a package is being built).
set(dir "${CMAKE_INSTALL_PREFIX}/${CDDP_INSTALL_LIBDIR}")
get_filename_component(dir "${dir}" REALPATH)
if(NOT "$ENV{DESTDIR}" STREQUAL "")
    return()
endif()
find_program(CDDP_LDCONFIG ldconfig PATHS /sbin /usr/sbin)
set(searched FALSE)
if(CDDP_LDCONFIG)
    execute_process(COMMAND "${CDDP_LDCONFIG}" -v -N -X OUTPUT_VARIABLE listing ERROR_QUIET)
    string(REPLACE "\n" ";" lines "${listing}")
    foreach(line IN LISTS lines)
        if(line MATCHES "^(/[^:]*):")
            get_filename_component(d "${CMAKE_MATCH_1}" REALPATH)
            if(d STREQUAL dir)
                set(searched TRUE)
            endif()
        endif()
    endforeach()
endif()
if(searched)
    execute_process(COMMAND "${CDDP_LDCONFIG}" RESULT_VARIABLE rc ERROR_VARIABLE why)
    if(rc EQUAL 0)
        message(STATUS "cddp: ran ldconfig: programs find libcddp.so.0 in ${dir}")
        return()
    endif()
    message(STATUS "cddp: ldconfig failed (${why}): run it as root, so that programs find "
                   "libcddp.so.0 in ${dir}")
else()
    message(STATUS "cddp: ${dir} is not a folder the loader searches: programs built with "
                   "`pkg-config --cflags --libs cddp` find libcddp.so.0 there by themselves "
                   "(the line carries -Wl,-rpath); for others, set LD_LIBRARY_PATH=${dir}, or "
                   "link the static library (pkg-config --static)")
endif()
