# Writes <PKGDIR>/metadata.json after the variant libraries are linked. The revision is derived
# from the libraries' digests, so a rebuilt package with different bytes gets a new revision.
string(REPLACE "," ";" ISAS "${ISAS}")
set(variants "")
set(all_digests "${NAME}@${VERSION}")
foreach(isa ${ISAS})
  set(variant cpu-${ARCH}-${OS}-${isa})
  set(rel build/${variant}/${LIBNAME})
  file(SHA256 ${PKGDIR}/${rel} digest)
  string(APPEND all_digests ":${digest}")
  set(req "")
  string(REPLACE "," ";" required "${REQ_${isa}}")
  foreach(f ${required})
    if(req)
      string(APPEND req ", ")
    endif()
    string(APPEND req "\"${f}\"")
  endforeach()
  if(variants)
    string(APPEND variants ",\n")
  endif()
  string(APPEND variants "    {\"name\": \"${variant}\", \"arch\": \"${ARCH}\", \"os\": \"${OS}\", "
         "\"isa\": \"${isa}\", \"requires\": [${req}], \"library\": \"${rel}\", "
         "\"sha256\": \"${digest}\"}")
endforeach()
string(SHA256 rev "${all_digests}")
string(SUBSTRING ${rev} 0 12 rev)
file(WRITE ${PKGDIR}/metadata.json
     "{\n  \"name\": \"${NAME}\",\n  \"version\": \"${VERSION}\",\n  \"revision\": \"${rev}\",\n"
     "  \"abi_major\": ${ABI_MAJOR},\n  \"abi_minor\": ${ABI_MINOR},\n  \"variants\": [\n${variants}\n  ]\n}\n")
