# Run after cargo, on every build (capi/CMakeLists.txt): put cargo's
# libraries under their installed names, in the build tree, where the
# in-tree targets point and `cmake --install` copies from.
#
#   CARGO_SHARED, CARGO_STATIC  what cargo made
#   SHARED, STATIC              their names here
#   LINKS                       symlinks to make beside SHARED: NAME=TARGET;...
#   DEF, IMPLIB, DLLTOOL        Windows: the exports the linker wrote out, the
#                               import library to make from them for SHARED's
#                               name, and the tool that makes it
#
# Only a file that changed is copied again, so a build that changed nothing
# relinks nothing downstream.
cmake_minimum_required(VERSION 3.16)

foreach (pair "${CARGO_SHARED}=${SHARED}" "${CARGO_STATIC}=${STATIC}")
    string(REGEX REPLACE "=.*" "" from "${pair}")
    string(REGEX REPLACE ".*=" "" to "${pair}")
    if (NOT EXISTS "${from}")
        message(FATAL_ERROR "cargo did not make ${from}")
    endif()
    get_filename_component(dir "${to}" DIRECTORY)
    file(MAKE_DIRECTORY "${dir}")
    execute_process(COMMAND "${CMAKE_COMMAND}" -E copy_if_different "${from}" "${to}"
        RESULT_VARIABLE rc)
    if (NOT rc EQUAL 0)
        message(FATAL_ERROR "could not copy ${from} to ${to}")
    endif()
endforeach()

get_filename_component(dir "${SHARED}" DIRECTORY)
foreach (link IN LISTS LINKS)
    string(REGEX REPLACE "=.*" "" name "${link}")
    string(REGEX REPLACE ".*=" "" target "${link}")
    file(CREATE_LINK "${target}" "${dir}/${name}" SYMBOLIC)
endforeach()

# cargo's import library names weightmap_capi.dll; this one names the DLL
# as installed. Made again only when the linker wrote the exports anew.
if (IMPLIB AND (NOT EXISTS "${IMPLIB}" OR "${DEF}" IS_NEWER_THAN "${IMPLIB}"))
    get_filename_component(dll "${SHARED}" NAME)
    execute_process(COMMAND "${DLLTOOL}" -d "${DEF}" -D "${dll}" -l "${IMPLIB}"
        RESULT_VARIABLE rc)
    if (NOT rc EQUAL 0)
        message(FATAL_ERROR "${DLLTOOL} could not make ${IMPLIB} from ${DEF}")
    endif()
endif()
